"""The controller: builds every part from one Config, runs the loop, stops cleanly.

The loop reads like pseudocode: wait for a batch, train, publish weights every
`learner.sync_every` steps, log. Rollout workers generate on their own the
whole time; the only waits are the ones the staleness bound forces, and they
are measured (`time/learner_wait_s`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import ray
import yaml
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from actors.buffer import ReplayBuffer
from actors.learner import Learner
from actors.model_files import ModelFiles
from actors.rollout import RolloutWorker
from algorithms import get_algorithm
from asyncrl.analysis import bottleneck, eval_summary
from asyncrl.checkpoint import latest_checkpoint, read_state, truncate_metrics, write_checkpoint
from asyncrl.config import Config
from asyncrl.metrics import MetricsSink
from asyncrl.models import model_source
from asyncrl.models.cache import ModelSource, model_on_this_node
from asyncrl.tasks import make_reward, make_task
from asyncrl.weights import free_port

ACTOR_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "WANDB_SILENT": "true", "VLLM_LOGGING_LEVEL": "ERROR"}


def unreachable(address: str, timeout_s: float = 5.0) -> str:
    """Why nothing answers at a Ray address ("" when something does, or for forms Ray resolves itself)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not port.isdigit():  # "auto" and other forms Ray resolves itself
        return ""
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc})"
    return ""


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, naming the address, when nothing listens there (ray.init would retry for minutes)."""
    if why := unreachable(address, timeout_s):
        raise ValueError(f"Ray address {address!r} (run.ray_address or RAY_ADDRESS): {why}")


def recorded_cluster() -> tuple[str, str]:
    """(address, file) of the cluster the last `ray start` on this machine recorded, ("", file) if none."""
    from ray._common.utils import get_ray_address_file  # where ray.init() itself looks

    path = get_ray_address_file(None)
    return (Path(path).read_text().strip() if os.path.isfile(path) else ""), path


def choose_cluster(given: str, recorded: str, record_file: str, why_unreachable: str) -> tuple[str, str]:
    """Which cluster to use: (address for ray.init, "" to start a local one; a line to tell the user, or "").

    `given` is run.ray_address or RAY_ADDRESS ("local": always a fresh local cluster); without it, a cluster that
    `ray start` recorded is joined if it answers, and a record left by a head that died without `ray stop` is
    named and passed over (ray.init would try to join it and fail with an unrelated message)."""
    if given:
        return ("" if given == "local" else given), ""
    if not recorded:
        return "", ""
    if why_unreachable:
        return "", (f"asyncrl: {record_file} names a Ray cluster at {recorded}, but {why_unreachable}: a head stopped "
                    f"without `ray stop` left it behind (`ray stop` removes it). Starting a local cluster instead.")
    return recorded, f"asyncrl: joining the Ray cluster at {recorded} (started by `ray start`; run.ray_address=local for a private one)"


def connect_ray(cfg: Config) -> bool:
    """Join RAY_ADDRESS / run.ray_address, or the cluster `ray start` recorded, else start a local cluster.
    True if started here."""
    given = cfg.run.ray_address or os.environ.get("RAY_ADDRESS", "")
    recorded, record_file = ("", "") if given else recorded_cluster()
    address, message = choose_cluster(given, recorded, record_file, unreachable(recorded) if recorded else "")
    if message:
        print(message, file=sys.stderr, flush=True)
    runtime_env = {"env_vars": ACTOR_ENV}
    if address:
        ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING")
        return False
    need = cfg.rollout.num_workers * cfg.rollout.num_cpus + cfg.learner.num_workers * cfg.learner.num_cpus
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(need)), runtime_env=runtime_env,
             logging_level="WARNING", include_dashboard=False)
    return True


def resource_pool(name: str, n: int, num_cpus: float, num_gpus: float, resources: dict[str, float], timeout_s: float = 120.0) -> PlacementGroup:
    """A placement group of n identical bundles; a clear error when the cluster cannot hold it."""
    bundle = {k: v for k, v in {"CPU": num_cpus, "GPU": num_gpus, **resources}.items() if v > 0}
    pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK", name=f"asyncrl-{name}-{uuid.uuid4().hex[:6]}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise RuntimeError(
            f"the {name} pool ({n} x {bundle}) could not be placed within {timeout_s:.0f} s; "
            f"cluster resources: {ray.cluster_resources()}"
        )
    return pg


def in_pool(pg: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


class Controller:
    def __init__(self, cfg: Config, run_dir: Path, model: ModelSource, resume: Path | None = None) -> None:
        """Build every part; with `resume` (a checkpoint directory) continue that run's state."""
        self.cfg, self.run_dir, self.model = cfg, run_dir, model
        state = read_state(resume) if resume is not None else {}
        self.cursors = {int(k): v for k, v in state.get("worker_cursors", {}).items()}  # prompts drawn before this process
        self.run_id = f"{run_dir.name}-{uuid.uuid4().hex[:6]}"
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.buffer = ray.remote(ReplayBuffer).options(num_cpus=0, scheduling_strategy=here).remote(cfg, str(run_dir / "trajectories"))
        l, r = cfg.learner, cfg.rollout
        # separate pools, so that on a cluster the two land where their resources are
        self.pools = [resource_pool("learner", l.num_workers, l.num_cpus, l.num_gpus, l.resources)]
        self.pools.append(resource_pool("rollout", r.num_workers, r.num_cpus, r.num_gpus, r.resources))
        self.pool_nodes = [list(ray.util.placement_group_table(pg)["bundles_to_node_id"].values()) for pg in self.pools]
        self.model_paths = place_model(model, {n for nodes in self.pool_nodes for n in nodes})
        learner_opts = {"num_cpus": l.num_cpus, "num_gpus": l.num_gpus, "resources": l.resources}
        self.learners = [
            ray.remote(Learner).options(**learner_opts, scheduling_strategy=in_pool(self.pools[0], i)).remote(cfg, self.model_paths[self.pool_nodes[0][i]], i)
            for i in range(l.num_workers)
        ]
        self.learner = self.learners[0]  # rank 0 publishes weights and saves
        self.workers = [self._new_worker(i, self.cursors.get(i, 0), 0) for i in range(r.num_workers)]
        self.restarts = 0
        self.non_finite_streak = 0
        self.cursor_offsets: dict[int, int] = {}
        self.version = 0
        self.in_flight: tuple[list, bool] | None = None  # (each engine's update_weights ref, cuda_ipc?) of the version being loaded
        self.tokens_t = time.time()
        self.worker_seen: dict[int, dict] = {}  # worker id -> counters at the previous step
        self.trained_total, self.learner_compute_total = 0, 0.0
        self.last_histograms: dict[str, list[float]] = {}
        self.placement = {
            "learner_nodes": ray.get([a.node_id.remote() for a in self.learners]),
            "rollout_nodes": ray.get([w.node_id.remote() for w in self.workers]),
        }
        self._init_learner_group()
        self.start_step = 0
        if resume is not None:
            self._restore(resume, state)
        self._init_weight_sync()
        if resume is not None:  # the engines start from the initial model: give them the checkpoint's policy
            self.sync_weights()
            self.settle_weights()

    def _new_worker(self, i: int, cursor: int, first_group: int):
        r = self.cfg.rollout
        opts = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus, "resources": r.resources, "max_concurrency": 4}
        return (ray.remote(RolloutWorker).options(**opts, scheduling_strategy=in_pool(self.pools[1], i))
                .remote(i, self.cfg, self.model_paths[self.pool_nodes[1][i]], self.buffer, self.run_id, cursor, first_group))

    def worker_stats(self, timeout_s: float = 60.0) -> list[dict]:
        """Every worker's counters; a worker whose process died is replaced first (and its lost groups recorded)."""
        while True:
            refs = [w.stats.remote() for w in self.workers]
            dead = []
            for i, ref in enumerate(refs):
                try:
                    ray.get(ref, timeout=timeout_s)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                    dead.append((i, exc))
            if not dead:
                return ray.get(refs)
            for i, exc in dead:
                self.replace_worker(i, type(exc).__name__)

    def replace_worker(self, i: int, why: str) -> None:
        """Rollout worker i is gone: record what it took with it, start a replacement where it stopped, rejoin the weight group."""
        self.restarts += 1
        if self.restarts > self.cfg.rollout.max_restarts:
            raise RuntimeError(f"rollout worker {i} died ({why}); rollout.max_restarts={self.cfg.rollout.max_restarts} restarts used up")
        ray.kill(self.workers[i], no_restart=True)
        self._collect_loads(skip=i)  # the others finish loading the version in flight before the group is rebuilt
        reason = f"rollout worker {i} died while generating this group ({why})"
        groups = ray.get(self.buffer.forfeit.remote(i, self.run_id, self.cfg.rollout.group_size, reason))
        print(f"asyncrl: rollout worker {i} died ({why}); restarting it (restart {self.restarts})", flush=True)
        # every admitted group drew one prompt: the replacement continues the stream and the group numbering
        self.workers[i] = self._new_worker(i, self.cursors.get(i, 0) + groups, groups)
        self.cursor_offsets[i] = groups  # prompts drawn in this process by worker i's earlier incarnations
        self.worker_seen.pop(i, None)  # its counters start again from 0
        try:  # its engine is up before the weight group is rebuilt around it (a rank missing there stalls everyone)
            ray.get(self.workers[i].node_id.remote())
        except ray.exceptions.RayActorError:
            self.replace_worker(i, "died while starting")  # bounded by rollout.max_restarts
            return
        self._init_weight_sync()
        self._publish()
        self.settle_weights()  # the replacement starts generating from the current version
        ray.get(self.workers[i].start.remote())

    def _restore(self, checkpoint: Path, state: dict) -> None:
        ray.get([a.load_checkpoint.remote(str(checkpoint)) for a in self.learners])
        self.start_step, self.version = state["next_step"], state["version"]
        self.trained_total, self.learner_compute_total = state["trained_total"], state["learner_compute_total"]
        consumed_groups = self.trained_total // self.cfg.rollout.group_size
        ray.get(self.buffer.restore.remote(self.version, consumed_groups, state["buffer_counts"]))

    def checkpoint(self, next_step: int) -> Path:
        """Everything needed to continue at `next_step`; the trajectory record is flushed first."""
        stats = self.worker_stats()
        ray.get(self.buffer.flush.remote())
        counts = ray.get(self.buffer.stats.remote())
        state = {
            "next_step": next_step, "version": self.version, "run_id": self.run_id,
            "trained_total": self.trained_total, "learner_compute_total": self.learner_compute_total,
            "worker_cursors": {
                str(st["worker_id"]): self.cursors.get(st["worker_id"], 0) + self.cursor_offsets.get(st["worker_id"], 0) + st["prompts_drawn"]
                for st in stats
            },
            "buffer_counts": {k: counts[k] for k in ("admitted_groups", "refused_admissions", "consumed", "dropped_stale", "dropped_error", "aborted")},
        }
        save = lambda d: ray.get(self.learner.save_checkpoint.remote(str(d)))  # noqa: E731  (the learner writes learner.pt)
        return write_checkpoint(self.run_dir, next_step, state, save, self.cfg.run.keep_checkpoints)

    def _rendezvous(self) -> str:
        """Loopback when everything runs on one node, else the learner rank 0's node address."""
        one_node = len({*self.placement["learner_nodes"], *self.placement["rollout_nodes"]}) == 1
        return "127.0.0.1" if one_node else ray.get(self.learner.node_ip.remote())

    def _init_learner_group(self) -> None:
        if len(self.learners) == 1:
            return
        host = self._rendezvous()
        port = ray.get(self.learner.pick_port.remote(host))
        ray.get([a.init_learner_group.remote(host, port, i, len(self.learners)) for i, a in enumerate(self.learners)])

    def _init_weight_sync(self) -> None:
        host = self._rendezvous()
        port = ray.get(self.learner.pick_port.remote(host))
        meta, backend = ray.get([self.learner.weight_meta.remote(), self.learner.backend.remote()])
        world = 1 + len(self.workers)
        bucket = self.cfg.learner.sync_bucket_bytes
        refs = [self.learner.init_weight_sync.remote(host, port, world)]
        refs += [w.init_weight_sync.remote(host, port, 1 + i, world, backend, meta, bucket) for i, w in enumerate(self.workers)]
        ray.get(refs)

    def evaluate(self) -> list[float] | None:
        """Each held-out problem's greedy score, in the task's order (None with run.eval off)."""
        if not self.cfg.run.eval:
            return None
        task = make_task(self.cfg.task, self.cfg.run.seed)
        return ray.get(self.workers[0].evaluate.remote(task.eval_prompts()))

    def train(self, sink: MetricsSink) -> dict:
        cfg, t_start = self.cfg, time.time()
        before = self.evaluate()
        ray.get([w.start.remote() for w in self.workers])
        history, every = [], cfg.run.checkpoint_every
        for step in range(self.start_step, cfg.run.steps):
            history.append(self.step(step))
            sink.log(history[-1], histograms=self.last_histograms)
            if every and ((step + 1) % every == 0 or step + 1 == cfg.run.steps):
                self.checkpoint(step + 1)
            if cfg.run.snapshot_every and ((step + 1) % cfg.run.snapshot_every == 0 or step + 1 == cfg.run.steps):
                (self.run_dir / "snapshots").mkdir(exist_ok=True)
                ray.get(self.learner.save_policy.remote(str(self.run_dir / "snapshots" / f"step-{step + 1:06d}.pt")))
        self.settle_weights()  # the final version reaches every engine before the loops stop and the evaluation
        ends = ray.get([w.stop.remote() for w in self.workers])
        buffer_counts = ray.get(self.buffer.close.remote())
        after = self.evaluate()
        ray.get(self.learner.save.remote(str(self.run_dir / "final_model"), self.model_paths[self.pool_nodes[0][0]]))
        return {
            "steps": cfg.run.steps, "resumed_at_step": self.start_step or None, "wall_s": time.time() - t_start, "policy_version": self.version,
            **eval_summary(before, after),
            "samples": buffer_counts, "rollout": ends, "rollout_restarts": self.restarts, "placement": self.placement,
            "bottleneck": dataclasses.asdict(bottleneck(history)),
        }

    def check_non_finite(self, step: int, metrics: dict) -> None:
        """Count steps whose every update was skipped (non-finite loss, ratio or gradient); too many in a row
        stop the run after a checkpoint of the last good weights (skipped updates never changed them)."""
        every_update_skipped = metrics["learner/skipped_updates"] >= self.cfg.learner.mini_batches
        self.non_finite_streak = self.non_finite_streak + 1 if every_update_skipped else 0
        limit = self.cfg.learner.max_non_finite_steps
        if self.non_finite_streak >= limit:
            saved = self.checkpoint(step + 1) if self.cfg.run.checkpoint_every else None
            where = f"; checkpoint at {saved}" if saved else ""
            raise RuntimeError(f"{limit} steps in a row had only non-finite losses or gradients (last: step {step}){where}")

    def next_batch(self, step: int, poll_s: float = 5.0) -> list[dict]:
        """Wait for a batch, checking the rollout workers every `poll_s`: a failed worker stops the run with its own error."""
        timeout = self.cfg.buffer.sample_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            wait = max(0.0, min(poll_s, deadline - time.monotonic()))
            batch = ray.get(self.buffer.get_batch.remote(self.cfg.groups_per_step, self.version, step, wait))
            if batch is not None:
                return batch
            stats = self.worker_stats()
            errors = [s["error"] for s in stats if s["error"]]
            if errors:
                raise RuntimeError("; ".join(errors))
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no batch within buffer.sample_timeout_s={timeout}s at step {step}; rollout workers: {stats}")

    def step(self, step: int) -> dict:
        t0 = time.perf_counter()
        batch = self.next_batch(step)
        waited = time.perf_counter() - t0
        batch_ref = ray.put(batch)  # one copy in the object store, whatever the number of learner workers
        metrics = ray.get([a.train_step.remote(batch_ref, self.version) for a in self.learners])[0]
        self.check_non_finite(step, metrics)
        sync = {"seconds": 0.0, "bytes": 0, "settle_s": 0.0, "send_s": 0.0, "load_s": 0.0}
        if (step + 1) % self.cfg.learner.sync_every == 0 or step == self.cfg.run.steps - 1:
            sync = self.sync_weights()
        if metrics.get("alert/kl"):
            action = "rolled back to the last good weights" if metrics.get("alert/rolled_back") else self.cfg.algorithm.kl_action
            print(f"asyncrl: ALERT step {step}: kl/ref {metrics['kl/ref']:.4f} > {self.cfg.algorithm.kl_alert} ({action})", flush=True)
        step_s = time.perf_counter() - t0
        compute_s = metrics["time/train_end"] - metrics["time/train_start"]
        self.trained_total += len(batch)
        self.learner_compute_total += compute_s * len(self.learners)
        metrics.update(self.rollout_metrics())
        metrics.update(self.record_engine_trace(step))
        metrics.update({
            "step": step, "policy_version": self.version, "time/step_s": step_s,
            "time/learner_wait_s": waited, "time/learner_wait_frac": waited / step_s, "time/learner_compute_s": compute_s,
            "time/weight_sync_s": sync["seconds"], "time/weight_sync_frac": sync["seconds"] / step_s, "weights/sync_bytes": sync["bytes"],
            "time/weight_settle_s": sync["settle_s"], "time/weight_send_s": sync["send_s"], "time/weight_load_s": sync["load_s"],
            "samples/trained_total": self.trained_total,
            "samples/effective_rate": self.trained_total / max(metrics["samples/generated_total"], 1),
            "samples/cost_per_1k_effective": 1000 * (metrics["rollout/busy_s_total"] + self.learner_compute_total) / self.trained_total,
        })
        self.last_histograms = batch_histograms(batch, self.version)
        return metrics

    def sync_weights(self) -> dict:
        """Publish the learner's weights as the next version, without waiting for the engines to load it.

        The version published before is settled first (every engine has loaded it, or a worker that died
        doing so is replaced), so at most one version is in flight. The learner's side of the broadcast
        and the engines' loads overlap the next step's training and generation; what is left on the
        controller's path is `seconds`."""
        t0 = time.perf_counter()
        settled = self.settle_weights()
        waited = time.perf_counter() - t0
        self.version += 1
        sent = self._publish()
        return {"seconds": time.perf_counter() - t0, "settle_s": waited, **settled, **sent}

    def _publish(self) -> dict:
        """Send the learner's weights to every engine as `self.version`; the loads stay in flight (`settle_weights`)."""
        ipc = self.cfg.learner.weight_transport == "cuda_ipc"
        sent = ray.get(self.learner.share_weights_ipc.remote() if ipc else self.learner.broadcast_weights.remote())
        handles = sent.get("handles")
        receivers = [w.update_weights.remote(self.version, handles) for w in self.workers]
        self.buffer.set_version.remote(self.version)  # the buffer's calls run in the order they were sent
        self.in_flight = (receivers, ipc)
        return {"bytes": sent["bytes"], "send_s": sent["seconds"]}

    def _collect_loads(self, skip: int | None = None) -> tuple[float, list[int]]:
        """Wait for the version in flight: (slowest engine's receive-and-load seconds, workers that died doing it).

        A peer dying breaks the broadcast for every receiver (gloo fails it on all ranks at once); the survivors
        keep their previous weights (nothing is loaded before the last bucket is in) and get the version again
        once the group is rebuilt, so their errors are expected then and only then."""
        if self.in_flight is None:
            return 0.0, []
        (receivers, ipc), self.in_flight = self.in_flight, None
        dead, errors, load_s = [], [], 0.0
        for i, ref in enumerate(receivers):
            try:
                load_s = max(load_s, ray.get(ref)["seconds"])
            except ray.exceptions.RayActorError:  # died mid-update
                dead.append(i)
            except ray.exceptions.RayTaskError as exc:
                errors.append(exc)
        if errors and not dead and skip is None:
            raise errors[0]
        if ipc:  # the engines have mapped and copied the buckets: the learner may free them
            ray.get(self.learner.release_weights_ipc.remote())
        return load_s, [i for i in dead if i != skip]

    def settle_weights(self) -> dict:
        """Block until every engine has loaded the version in flight; replace the ones that died doing it."""
        load_s, dead = self._collect_loads()
        for i in dead:  # rebuilds the group and publishes again, to everyone
            self.replace_worker(i, "died during a weight update")
        return {"load_s": load_s}

    def rollout_metrics(self) -> dict:
        stats = self.worker_stats()
        errors = [s["error"] for s in stats if s["error"]]
        if errors:
            raise RuntimeError("; ".join(errors))
        now = time.time()
        elapsed = max(now - self.tokens_t, 1e-9)
        per_worker = {}
        for st in stats:  # rates since the previous step, per worker
            before = self.worker_seen.get(st["worker_id"], {"tokens": 0, "busy_s": 0.0, "idle_s": 0.0})
            busy, idle = st["busy_s"] - before["busy_s"], st["idle_s"] - before["idle_s"]
            per_worker[f"rollout/w{st['worker_id']}/tokens_per_s"] = (st["tokens"] - before["tokens"]) / elapsed
            per_worker[f"rollout/w{st['worker_id']}/idle_frac"] = idle / max(busy + idle, 1e-9)
            self.worker_seen[st["worker_id"]] = {k: st[k] for k in ("tokens", "busy_s", "idle_s")}
        self.tokens_t = now
        busy = sum(s["busy_s"] for s in stats)
        idle = sum(s["idle_s"] for s in stats)
        buf = ray.get(self.buffer.stats.remote())
        return {
            "rollout/tokens_per_s": sum(v for k, v in per_worker.items() if k.endswith("tokens_per_s")),
            "rollout/idle_frac": idle / max(busy + idle, 1e-9), **per_worker,
            "rollout/busy_s_total": busy, "rollout/restarts_total": self.restarts, "buffer/lost_samples": buf["lost"], "rollout/resubmitted_total": sum(s["resubmitted"] for s in stats),
            "rollout/drain_s_total": sum(s["drain_s"] for s in stats),
            "samples/generated_total": sum(s["groups_done"] for s in stats) * self.cfg.rollout.group_size,
            "rollout/inflight_groups": sum(s["inflight_groups"] for s in stats),
            "buffer/buffered_groups": buf["buffered_groups"], "buffer/refused_admissions": buf["refused_admissions"],
            "buffer/dropped_stale": buf["dropped_stale"], "buffer/dropped_error": buf["dropped_error"],
        }

    def record_engine_trace(self, step: int) -> dict:
        """Append every worker's engine steps since the last learner step to RUN_DIR/engine_trace.jsonl (one line per
        worker and learner step: wall times and running requests); returns the running-request metrics."""
        traces = ray.get([w.engine_trace.remote() for w in self.workers])
        running = [n for trace in traces for _, n in trace]
        with open(self.run_dir / "engine_trace.jsonl", "a") as f:
            for i, trace in enumerate(traces):
                if trace:
                    f.write(json.dumps({"step": step, "worker": i, "t": [round(t, 4) for t, _ in trace], "running": [n for _, n in trace]}) + "\n")
        if not running:
            return {}
        return {"rollout/running_mean": sum(running) / len(running), "rollout/running_min": float(min(running)),
                "rollout/engine_steps": float(len(running))}

    def shutdown(self) -> None:
        for actor in [*self.workers, *self.learners, self.buffer]:
            ray.kill(actor)
        for pg in self.pools:
            remove_placement_group(pg)


def place_model(model: ModelSource, nodes: set[str]) -> dict[str, str]:
    """Each node's directory of the model: on the driver's node its own; on every other node found there, or for a
    built-in copied from the driver's node first (one task per node). A node that lacks a local model directory
    fails the run with a ValueError naming the node and the path."""
    here = ray.get_runtime_context().get_node_id()
    paths = {here: model.path}
    others = sorted(nodes - {here})
    if not others:
        return paths
    pin = NodeAffinitySchedulingStrategy(here, soft=False)
    files = ray.remote(ModelFiles).options(num_cpus=0, scheduling_strategy=pin).remote(model.path) if model.builtin else None
    read = None if files is None else (lambda rel, offset, size: ray.get(files.read.remote(rel, offset, size)))
    find = ray.remote(model_on_this_node).options(num_cpus=0, max_retries=0)
    refs = [find.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(model, read) for n in others]
    try:
        paths.update(zip(others, ray.get(refs)))
    except ray.exceptions.RayTaskError as exc:
        raise ValueError(str(exc.cause)) from None
    finally:
        if files is not None:
            ray.kill(files)
    return paths


def batch_histograms(batch: list[dict], version: int) -> dict[str, list[float]]:
    """Per-sample values of one batch, for wandb histograms."""
    return {
        "reward/hist": [float(s["reward"]) for s in batch],
        "staleness/hist": [float(version - s["policy_version_start"]) for s in batch],
        "samples/response_len_hist": [float(len(s["response_ids"])) for s in batch],
    }


def check_plugins(cfg: Config) -> None:
    """Task, reward and algorithm resolve before Ray starts (ValueError naming the culprit)."""
    make_task(cfg.task, cfg.run.seed)
    make_reward(cfg.task.reward)
    get_algorithm(cfg.algorithm.name)


def prepare_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.run.output_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return run_dir


def run(cfg: Config, resume: bool = False) -> dict:
    """Train according to `cfg`; writes the run directory and returns the summary.

    With `resume`, continue the run in `run.output_dir` from its latest checkpoint:
    metrics after that checkpoint's step are dropped (those steps are redone),
    trajectories and wandb append (a new run_id marks the records of this attempt).
    """
    check_plugins(cfg)
    model = model_source(cfg.model.path, cfg.task.digits, cfg.run.seed, cfg.model.cache_dir)
    checkpoint = None
    if resume:
        checkpoint = latest_checkpoint(Path(cfg.run.output_dir))
        if checkpoint is None:
            raise ValueError(f"--resume: no checkpoint in {Path(cfg.run.output_dir) / 'checkpoints'} (run.checkpoint_every was 0, or the run stopped before its first)")
        truncate_metrics(Path(cfg.run.output_dir) / "metrics.jsonl", read_state(checkpoint)["next_step"])
    if (given := cfg.run.ray_address or os.environ.get("RAY_ADDRESS", "")) and given != "local":
        check_reachable(given)
    run_dir = prepare_run_dir(cfg)
    started = connect_ray(cfg)
    wandb_id = (run_dir / "wandb_run_id").read_text().strip() if resume and (run_dir / "wandb_run_id").is_file() else None
    sink = MetricsSink(run_dir, cfg.to_dict(), cfg.logging.wandb, cfg.logging.wandb_project, cfg.logging.wandb_mode, cfg.logging.console, wandb_id)
    controller = None
    try:
        controller = Controller(cfg, run_dir, model, checkpoint)
        summary = controller.train(sink)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        sink.summary({k: v for k, v in summary.items() if isinstance(v, (int, float))})
        return summary
    finally:
        sink.close()
        if controller is not None:
            controller.shutdown()
        if started:
            ray.shutdown()
