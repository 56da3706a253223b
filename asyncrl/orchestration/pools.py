"""The rollout workers in their placement group: started, asked for their counters, replaced when one dies; the
reward actors in theirs.

A dead worker is reported by `stats`; `retire` and `restart` replace it where it stopped (its lost groups are
recorded by the buffer, the replacement continues its prompt stream and group numbering). The pool also grows and
shrinks at the top (asyncrl.core.elastic): `launch` starts worker n on a thread (its own placement group beyond
the starting pool's bundles, the model placed on its node, its engine up) and `leave` ends a removed worker's
life once it has finished what it held. What a worker needs from the weight sync (the group re-formed, the current
version) is arranged by the fleet (asyncrl/orchestration/fleet.py).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from asyncrl.actors.engines import engine_runtime_env
from asyncrl.actors.reward import RewardWorker
from asyncrl.actors.rollout import RolloutWorker
from asyncrl.core.config import Config
from asyncrl.core.messages import RewardStats, WorkerStats
from asyncrl.core.models.cache import ModelSource
from asyncrl.orchestration.cluster import bundle_nodes, in_pool, place_model, resource_pool


@dataclass
class Launch:
    """Worker `index` being started for the pool on a thread: `done` once its engine is up (`worker`) or it
    could not be (`error`)."""
    index: int
    done: threading.Event = field(default_factory=threading.Event)
    worker: object = None
    error: str | None = None
    abandoned: bool = False  # the fleet gave up on it: a worker that comes up later is killed
    lock: threading.Lock = field(default_factory=threading.Lock)


class RolloutPool:
    def __init__(self, cfg: Config, pg: PlacementGroup, model_paths: list[str], buffer, run_id: str, cursors: dict[int, int],
                 scorers: list | None = None) -> None:
        self.cfg, self.pg, self.buffer, self.run_id = cfg, pg, buffer, run_id
        # per worker index: (placement group, bundle, the model's directory on that bundle's node); the starting
        # pool's bundles stay reserved while the pool is smaller, an added worker's own group goes with it
        self.places: dict[int, tuple[PlacementGroup, int, str]] = {i: (pg, i, path) for i, path in enumerate(model_paths)}
        self.scorers = scorers or []  # the reward pool's actors, handed to every worker (and to replacements)
        self.cursors = cursors  # prompts drawn per worker before this process (a resumed run)
        self.cursor_offsets: dict[int, int] = {}  # prompts drawn in this process by worker i's earlier incarnations
        self.restarts = 0
        self.workers = [self._new(i, cursors.get(i, 0), 0) for i in range(cfg.rollout.num_workers)]

    def _new(self, i: int, cursor: int, first_group: int):
        r = self.cfg.rollout
        pg, bundle, model_path = self.places[i]
        opts = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus, "resources": r.resources, "max_concurrency": 4}
        runtime_env = engine_runtime_env(r.engine, on_gpu=r.num_gpus > 0)
        if runtime_env:  # merged by Ray over the job's runtime_env (its working_dir, env_vars)
            opts["runtime_env"] = runtime_env
        return (ray.remote(RolloutWorker).options(**opts, scheduling_strategy=in_pool(pg, bundle))
                .remote(i, self.cfg, model_path, self.buffer, self.run_id, cursor, first_group, self.scorers))

    # ---- growing and shrinking at the top (asyncrl.core.elastic) ----------------------------------

    def launch(self, i: int, model: ModelSource) -> Launch:
        """Start worker `i` (the next index) on a thread: placed (its own placement group past the starting pool's
        bundles, waiting up to run.hang_first_s for room), the model on its node, the engine up. It continues worker
        i's prompt stream and group numbering if an earlier worker i left; the fleet joins it to the weight group."""
        job = Launch(i)

        def start() -> None:
            pg = None
            try:
                if i not in self.places:
                    r = self.cfg.rollout
                    pg = resource_pool(f"rollout-{i}", 1, r.num_cpus, r.num_gpus, r.resources, timeout_s=self.cfg.run.hang_first_s)
                    node = bundle_nodes(pg)[0]
                    self.places[i] = (pg, 0, place_model(model, {node})[node])
                offset = self.cursor_offsets.get(i, 0)
                worker = self._new(i, self.cursors.get(i, 0) + offset, offset)
                try:
                    ray.get(worker.node_id.remote())  # its engine is up
                except ray.exceptions.RayActorError as exc:
                    raise RuntimeError(f"it died while starting: {exc}") from None
                with job.lock:
                    job.worker = worker
                    if job.abandoned:
                        raise RuntimeError("the pool change was abandoned before it came up")
            except Exception as exc:  # reported by the fleet; the pool stays as it was
                job.error = f"rollout worker {i} could not be started: {exc}"
                self._undo(job, pg)
            finally:
                job.done.set()

        threading.Thread(target=start, name=f"launch-rollout-{i}", daemon=True).start()
        return job

    def join(self, job: Launch) -> None:
        """A launched worker takes its place at the top of the pool."""
        assert job.index == len(self.workers) and job.worker is not None, (job.index, len(self.workers))
        self.workers.append(job.worker)

    def leave(self, why: str) -> int:
        """The last worker has left the pool (retired, or died meanwhile): any group it was admitted for and did
        not deliver is recorded as dropped_error with `why` (none, after a retirement that finished in time), its
        process ends, an added worker's placement group is freed. Returns the groups it was admitted for."""
        i = len(self.workers) - 1
        groups = ray.get(self.buffer.forfeit.remote(i, self.run_id, self.cfg.rollout.group_size, why))
        self.cursor_offsets[i] = groups
        ray.kill(self.workers.pop(), no_restart=True)
        pg, _, _ = self.places[i]
        if pg is not self.pg:
            del self.places[i]
            remove_placement_group(pg)
        return groups

    def discard(self, job: Launch) -> None:
        """A launched worker that will not join (its change was abandoned, or the run ends first): killed, and its
        own placement group freed, now or as soon as it comes up."""
        with job.lock:
            job.abandoned = True
            if not job.done.is_set() or job.error is not None:
                return  # its thread undoes it (or already has)
        self._undo(job, self.places[job.index][0] if job.index in self.places else None)

    def _undo(self, job: Launch, pg: PlacementGroup | None) -> None:
        if job.worker is not None:
            ray.kill(job.worker, no_restart=True)
        if pg is not None and pg is not self.pg:
            self.places.pop(job.index, None)
            remove_placement_group(pg)

    def stats(self, timeout_s: float = 60.0) -> tuple[list[WorkerStats], list[tuple[int, str]]]:
        """Every worker's counters, or ([], the dead: (index, why)) when some did not answer."""
        refs = [w.stats.remote() for w in self.workers]
        dead = []
        for i, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                dead.append((i, type(exc).__name__))
        return ([], dead) if dead else (ray.get(refs), [])

    def retire(self, i: int, why: str) -> None:
        """Worker i is gone: count the restart (a RuntimeError past rollout.max_restarts) and make sure it is dead."""
        self.restarts += 1
        if self.restarts > self.cfg.rollout.max_restarts:
            raise RuntimeError(f"rollout worker {i} died ({why}); rollout.max_restarts={self.cfg.rollout.max_restarts} restarts used up")
        ray.kill(self.workers[i], no_restart=True)

    def restart(self, i: int, why: str) -> bool:
        """Record the groups worker i took with it and start its replacement where it stopped; False if the
        replacement died while starting (retire it again)."""
        reason = f"rollout worker {i} died while generating this group ({why})"
        groups = ray.get(self.buffer.forfeit.remote(i, self.run_id, self.cfg.rollout.group_size, reason))
        print(f"asyncrl: rollout worker {i} died ({why}); restarting it (restart {self.restarts})", flush=True)
        # every admitted group drew one prompt: the replacement continues the stream and the group numbering
        self.workers[i] = self._new(i, self.cursors.get(i, 0) + groups, groups)
        self.cursor_offsets[i] = groups
        try:  # its engine is up before the weight group is rebuilt around it (a rank missing there stalls everyone)
            ray.get(self.workers[i].node_id.remote())
        except ray.exceptions.RayActorError:
            return False
        return True

    def prompt_cursors(self, stats: list[WorkerStats]) -> dict[str, int]:
        """Prompts drawn by each worker id over the whole run, for a checkpoint (a removed worker's too: one that
        comes back continues its stream)."""
        gone = {i: self.cursors.get(i, 0) + n for i, n in self.cursor_offsets.items() if i >= len(self.workers)}
        return {**{str(i): n for i, n in gone.items()},
                **{str(st.worker_id): self.cursors.get(st.worker_id, 0) + self.cursor_offsets.get(st.worker_id, 0) + st.prompts_drawn
                   for st in stats}}


class RewardPool:
    """The reward actors in their own placement group (reward.num_workers of them; none: rollout workers score
    in their loops). Ray restarts one whose process died (reward.max_restarts); the groups it held are recorded
    by the rollout workers that handed them over."""

    def __init__(self, cfg: Config, pg: PlacementGroup | None, buffer) -> None:
        rw = cfg.reward
        opts = {"num_cpus": rw.num_cpus, "num_gpus": rw.num_gpus, "resources": rw.resources, "max_restarts": rw.max_restarts,
                "max_concurrency": 1000}  # one pending call per group waiting to be scored
        place = (lambda i: {"scheduling_strategy": in_pool(pg, i)}) if pg is not None else (lambda i: {})  # no group: anywhere
        self.actors = [ray.remote(RewardWorker).options(**opts, **place(i)).remote(i, cfg, buffer) for i in range(rw.num_workers)]
        ray.get([a.node_id.remote() for a in self.actors])  # up (their reward imports) before any group is handed over

    def stats(self, timeout_s: float = 30.0) -> list[RewardStats]:
        """Each live actor's counters (one being restarted is left out this time)."""
        out = []
        for ref in [a.stats.remote() for a in self.actors]:
            try:
                out.append(ray.get(ref, timeout=timeout_s))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue
        return out

    def close(self) -> None:
        """Kill every scoring child process (the actors themselves are killed with the rest)."""
        refs = [a.close.remote() for a in self.actors]
        try:
            ray.get(refs, timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
