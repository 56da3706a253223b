"""The elastic rollout pool, carried out: the changes asked for (`asyncrl scale`, rollout.autoscale) started,
moved on at each step and put in place at version boundaries; and the running job's mailbox (actors/control.py)
that `asyncrl scale` and `asyncrl stop` write to.

One change at a time, at the top of the pool (asyncrl.core.elastic). New workers start on threads while the run
goes on (pools.RolloutPool.launch); a removed worker admits nothing more and finishes what it holds
(RolloutWorker.retire), one at a time. Either takes effect at a version boundary (`boundary`, called by the fleet
with nothing in flight): the fleet re-forms the weight group with the workers serving from then on and publishes
the next version to all of them in one broadcast.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import ray

from asyncrl.actors.control import CONTROL_FILE, NAMESPACE, RunControl, control_name
from asyncrl.analysis.runs import bottleneck
from asyncrl.core.config import Config
from asyncrl.core.elastic import Bounds, PoolChange, autoscale_target
from asyncrl.core.messages import WorkerStats
from asyncrl.core.models.cache import ModelSource
from asyncrl.orchestration.pools import Launch, RolloutPool


class ElasticPool:
    def __init__(self, cfg: Config, rollout: RolloutPool, model: ModelSource, gone: Callable[[int], None],
                 left: Callable[[WorkerStats], None]) -> None:
        """`gone(i)`: worker i left the pool; `left(stats)`: a removed worker's last counters."""
        r = cfg.rollout
        self.rollout, self.model, self.gone, self.left = rollout, model, gone, left
        self.bounds = Bounds.of(r.min_workers, r.max_workers, cfg.env.endpoint_port)
        self.retire_timeout_s = r.retire_timeout_s
        self.launch_limit_s = 2 * cfg.run.hang_first_s  # a launch not done by then is abandoned
        self.wanted: tuple[int, int, str] | None = None  # (workers, step asked, why): the next change
        self.change: PoolChange | None = None  # the change under way
        self.change_t0 = 0.0
        self.changes: list[PoolChange] = []  # every change, over the run
        self.launches: list[Launch] = []  # workers starting for the change under way
        self.retiring = None  # the last worker's retire call, while it finishes what it holds

    @property
    def workers(self) -> list:
        return self.rollout.workers

    @property
    def serving(self) -> list:
        """The workers that stay in the pool (the one being removed left out: it finishes, nothing new)."""
        return self.workers[:-1] if self.retiring is not None else self.workers

    @property
    def busy(self) -> bool:
        """A change is under way (or asked for)."""
        return self.change is not None or self.wanted is not None

    def is_retiring(self, i: int) -> bool:
        return self.retiring is not None and i == len(self.workers) - 1

    def want(self, workers: int, step: int, why: str) -> None:
        """Ask for `workers` rollout workers (`why`: "command", "autoscale: ..."); started by `advance` once the
        change under way, if any, is done. A later ask replaces one not yet started."""
        self.wanted = (workers, step, why)

    def advance(self) -> None:
        """Start the change asked for when none is under way: launch the new workers (they start on threads; the
        run goes on), or have the last worker retire (one at a time: each finishes the groups it holds)."""
        if self.change is None and self.wanted is not None:
            target, asked, why = self.wanted
            self.wanted = None
            n = len(self.workers)
            if target != n:
                self.change, self.change_t0 = PoolChange(asked, n, target, why), time.monotonic()
                print(f"asyncrl: rollout pool {n} -> {target} workers ({why})", flush=True)
                self._warn_if_no_room(sum(i not in self.rollout.places for i in range(n, target)))  # a starting bundle is reserved
                self.launches = [self.rollout.launch(i, self.model) for i in range(n, target)]
        if self.change is not None and self.retiring is None and len(self.workers) > self.change.after:
            self.retiring = self.workers[-1].retire.remote(self.retire_timeout_s)

    def _warn_if_no_room(self, new: int) -> None:
        """Say at once when the cluster has no room now for `new` workers that need placement groups of their own (each
        waits for room up to run.hang_first_s)."""
        r = self.rollout.cfg.rollout
        free = ray.available_resources().get("CPU", 0.0)
        if new * r.num_cpus > free + 1e-9:
            print(f"asyncrl: the cluster has {free:g} CPUs free now and {new} more rollout workers need {new * r.num_cpus:g} "
                  f"(rollout.num_cpus={r.num_cpus:g}); they wait for room up to run.hang_first_s", flush=True)

    def state(self, step: int) -> dict:
        """The pool now: workers serving, starting and retiring, the bounds, the change under way."""
        return {"serving": len(self.workers), "starting": len(self.launches), "retiring": int(self.retiring is not None),
                "min_workers": self.bounds.lo, "max_workers": self.bounds.hi, "step": step,
                "change": self.change.record() if self.change else None}

    def boundary(self, step: int) -> tuple[list[int], bool]:
        """At a version boundary, nothing in flight: the last worker leaves if its retirement is done, launched
        workers that are up join at the top. Returns (the indices that joined: they get the version about to be
        published, then start; whether the weight group must be re-formed)."""
        left = False
        if self.retiring is not None and ray.wait([self.retiring], timeout=0)[0]:
            i = len(self.workers) - 1
            try:
                self.left(ray.get(self.retiring))
                why = f"rollout worker {i} was removed from the pool before its group was delivered"
            except ray.exceptions.RayActorError:
                why = f"rollout worker {i} died while being removed from the pool"
            self.leave(why, step)
            left = True
        joined = []
        for job in sorted((j for j in self.launches if j.done.is_set()), key=lambda j: j.index):
            if job.index != len(self.workers):
                continue  # one below it has not joined (yet, or ever: then it is discarded below)
            if job.error is not None:
                self._abandon(job.error, step)
                break
            self.rollout.join(job)
            self.launches.remove(job)
            joined.append(job.index)
        if self.launches and time.monotonic() - self.change_t0 > self.launch_limit_s:
            self._abandon(f"rollout workers {[j.index for j in self.launches]} did not start within {self.launch_limit_s:.0f} s "
                          "(twice run.hang_first_s)", step)
        return joined, left or bool(joined)

    def leave(self, why: str, step: int) -> None:
        """The retiring worker (the last) leaves: what it was admitted for and did not deliver is recorded with
        `why` (pools.RolloutPool.leave); the caller re-forms the weight group."""
        i = len(self.workers) - 1
        self.retiring = None
        self.rollout.leave(why)
        self.gone(i)
        self.change_done(step)

    def _abandon(self, error: str, step: int) -> None:
        """The change under way cannot complete: its launches are discarded and the pool stays as it is."""
        print(f"asyncrl: rollout pool change abandoned: {error}", flush=True)
        for job in self.launches:
            self.rollout.discard(job)
        self.launches = []
        if self.change is not None:
            self.change.error = error
            self.change.after = len(self.workers)
            self.change_done(step)

    def change_done(self, step: int) -> None:
        """Record the change under way once the pool has its size."""
        change = self.change
        if change is None or len(self.workers) != change.after or self.launches or self.retiring is not None:
            return
        change.done_step, change.seconds = step, time.monotonic() - self.change_t0
        self.changes.append(change)
        self.change = None
        print(f"asyncrl: rollout pool now {len(self.workers)} workers ({change.seconds:.1f} s after it was asked for"
              f"{', ' + change.error if change.error else ''})", flush=True)

    def records(self) -> list[dict]:
        """Every change, for the summary; one still under way is recorded with the error "the run ended first"."""
        unfinished = [] if self.change is None else [{**self.change.record(), "error": "the run ended before it was in place"}]
        return [c.record() for c in self.changes] + unfinished

    def shutdown(self) -> None:
        for job in self.launches:  # started for a change the run ended before
            self.rollout.discard(job)


class RunCommands:
    """The running job's mailbox (actors/control.py), named after the run directory (after the run id when another
    run of that name is going on the cluster), and the autoscaler. Its name and the cluster's address go to
    RUN_DIR/control.json, where `asyncrl scale RUN_DIR` and `asyncrl stop RUN_DIR` find them."""

    def __init__(self, cfg: Config, run_dir: Path, run_id: str, pool: ElasticPool) -> None:
        self.cfg, self.pool = cfg, pool
        self.stopped = False  # `asyncrl stop RUN` ended the run
        for name in (control_name(run_dir.name), control_name(run_id)):
            try:
                self.actor = ray.remote(RunControl).options(name=name, namespace=NAMESPACE, num_cpus=0).remote(run_dir.name, pool.bounds)
                break
            except ValueError:  # the name is taken
                continue
        else:
            raise RuntimeError(f"could not name the run's control actor {control_name(run_id)!r}")
        # the cluster's auth mode (a local cluster's token auth, Ray's default, is on in this process's environment)
        record = {"name": name, "ray_address": ray.get_runtime_context().gcs_address, "auth_mode": os.environ.get("RAY_AUTH_MODE", "")}
        (run_dir / CONTROL_FILE).write_text(json.dumps(record))
        print(f"asyncrl: resize the rollout pool while the run goes: asyncrl scale {run_dir} N (asyncrl stop {run_dir}: end it cleanly)", flush=True)

    def stop_asked(self) -> bool:
        """`asyncrl stop RUN` was run: the step under way is the last."""
        if not self.stopped:
            self.stopped = ray.get(self.actor.stopping.remote())
        return self.stopped

    def step(self, step: int, pool_s: float) -> dict:
        """Take a pool size asked for with `asyncrl scale`, move the change under way on (ElasticPool.advance),
        tell the mailbox where the pool stands; the pool's metrics."""
        asked = ray.get(self.actor.take.remote())
        if asked is not None:
            self.pool.want(asked, step, "command")
        self.pool.advance()
        state = self.pool.state(step)
        self.actor.report.remote(state)
        return {"rollout/workers": state["serving"], "rollout/workers_starting": state["starting"],
                "rollout/workers_retiring": state["retiring"], "time/pool_change_s": pool_s}

    def autoscale(self, step: int, history: list[dict]) -> None:
        """rollout.autoscale: every rollout.autoscale_window steps with no change under way, one worker more or
        fewer as the bottleneck verdict over those steps says (asyncrl.core.elastic.autoscale_target)."""
        window = self.cfg.rollout.autoscale_window
        since = max((c.done_step for c in self.pool.changes), default=-1)
        if self.pool.busy or len(history) < window or step - since < window:
            return
        verdict = bottleneck(history[-window:]).kind
        target = autoscale_target(verdict, len(self.pool.workers), self.pool.bounds)
        if target != len(self.pool.workers):
            self.pool.want(target, step, f"autoscale: {verdict}")

    def close(self) -> None:
        ray.kill(self.actor)
