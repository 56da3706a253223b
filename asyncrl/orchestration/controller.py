"""The controller: builds every part from one Config, runs the loop, stops cleanly.

Where each responsibility lives: which cluster and where the pools and the model go (cluster.py), the rollout
workers and their replacement (pools.py), the weight-sync protocol (weight_sync.py), per-step metrics as pure
functions (step_metrics.py); here, the step loop and the decisions that need more than one of them.

The loop reads like pseudocode: wait for a batch, train, publish weights every
`learner.sync_every` steps, log. Rollout workers generate on their own the
whole time; the only waits are the ones the staleness bound forces, and they
are measured (`time/learner_wait_s`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
import uuid
from pathlib import Path

import ray
import yaml
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from asyncrl.actors.buffer import ReplayBuffer
from asyncrl.actors.learner import Learner
from asyncrl.algorithms import get_algorithm
from asyncrl.analysis.runs import bottleneck, eval_summary
from asyncrl.core.checkpoint import CHECKPOINT_HF_DIR, latest_checkpoint, read_state, truncate_metrics, write_checkpoint
from asyncrl.core.config import Config
from asyncrl.core.evaluation import eval_metrics, merge, split_evenly
from asyncrl.core.messages import RewardStats, WorkerStats
from asyncrl.core.metrics import MetricsSink
from asyncrl.core.models import model_source
from asyncrl.core.models.cache import ModelSource
from asyncrl.core.reward_files import check_reward_file
from asyncrl.core.rewards import make_reward
from asyncrl.core.tasks import make_task
from asyncrl.orchestration.cluster import bundle_nodes, check_reachable, connect_ray, in_pool, place_model, requested_address, resource_pool
from asyncrl.orchestration.pools import RewardPool, RolloutPool
from asyncrl.orchestration.step_metrics import (
    batch_histograms,
    engine_running,
    reward_metrics,
    rollout_metrics,
    sample_totals,
    timing_metrics,
)
from asyncrl.orchestration.weight_sync import WeightSync


class Controller:
    def __init__(self, cfg: Config, run_dir: Path, model: ModelSource, resume: Path | None = None) -> None:
        """Build every part; with `resume` (a checkpoint directory) continue that run's state."""
        self.cfg, self.run_dir = cfg, run_dir
        state = read_state(resume) if resume is not None else {}
        self.run_id = f"{run_dir.name}-{uuid.uuid4().hex[:6]}"
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.buffer = ray.remote(ReplayBuffer).options(num_cpus=0, scheduling_strategy=here).remote(cfg, str(run_dir / "trajectories"))
        l, r = cfg.learner, cfg.rollout
        # separate pools, so that on a cluster the two land where their resources are
        self.pools = [resource_pool("learner", l.num_workers, l.num_cpus, l.num_gpus, l.resources),
                      resource_pool("rollout", r.num_workers, r.num_cpus, r.num_gpus, r.resources)]
        rw = cfg.reward
        if rw.num_workers:
            self.pools.append(resource_pool("reward", rw.num_workers, rw.num_cpus, rw.num_gpus, rw.resources))
        self.rewards = RewardPool(cfg, self.pools[2] if rw.num_workers else None, self.buffer)
        nodes = [bundle_nodes(pg) for pg in self.pools[:2]]
        paths = place_model(model, {n for pool in nodes for n in pool})
        self.learner_model_path = paths[nodes[0][0]]
        learner_opts = {"num_cpus": l.num_cpus, "num_gpus": l.num_gpus, "resources": l.resources}
        self.learners = [
            ray.remote(Learner).options(**learner_opts, scheduling_strategy=in_pool(self.pools[0], i)).remote(cfg, paths[nodes[0][i]], i)
            for i in range(l.num_workers)
        ]
        self.learner = self.learners[0]  # rank 0 publishes weights and saves
        cursors = {int(k): v for k, v in state.get("worker_cursors", {}).items()}
        self.rollout = RolloutPool(cfg, self.pools[1], [paths[n] for n in nodes[1]], self.buffer, self.run_id, cursors, self.rewards.actors)
        self.sync = WeightSync(self.learners, cfg)
        self.non_finite_streak = 0
        self.final = False  # the step being run is the last (run.steps reached, or run.max_train_minutes spent)
        self.train_t0 = time.monotonic()
        self.version = 0
        self.tokens_t = time.time()
        self.worker_seen: dict[int, dict] = {}  # worker id -> counters at the previous step
        self.reward_seen: dict[int, RewardStats] = {}  # reward actor id -> its counters at the previous step
        self.trained_total, self.learner_compute_total = 0, 0.0
        self.last_histograms: dict[str, list[float]] = {}
        self.last_validation: tuple[int, list[float]] | None = None  # (version, each held-out problem's greedy score)
        self.pending_validation: tuple[int, list, float] | None = None  # (version, the workers' refs, start): run.eval_every
        self.placement = {
            "learner_nodes": ray.get([a.node_id.remote() for a in self.learners]),
            "rollout_nodes": ray.get([w.node_id.remote() for w in self.workers]),
        }
        self._init_learner_group()
        self.start_step = 0
        if resume is not None:
            self._restore(resume, state)
        self.sync.connect(self.workers, self._rendezvous())
        if resume is not None:  # the engines start from the initial model: give them the checkpoint's policy
            self.sync_weights()
            self.settle_weights()

    @property
    def workers(self) -> list:
        return self.rollout.workers

    @property
    def restarts(self) -> int:
        return self.rollout.restarts

    # ---- the loop ---------------------------------------------------------------------

    def train(self, sink: MetricsSink) -> dict:
        cfg, t_start = self.cfg, time.time()
        before = self.evaluate()
        ray.get([w.start.remote() for w in self.workers])
        history, every, steps_done = [], cfg.run.checkpoint_every, self.start_step
        self.train_t0 = time.monotonic()
        for step in range(self.start_step, cfg.run.steps):
            history.append(self.step(step))
            steps_done = step + 1
            if cfg.run.eval_every and (steps_done % cfg.run.eval_every == 0 or self.final):
                self.start_validation()
                if self.final:  # nothing follows to overlap it with: its scores are the final evaluation
                    history[-1].update(self.finish_validation())
            sink.log(history[-1], histograms=self.last_histograms)
            if every and (steps_done % every == 0 or self.final):
                self.checkpoint(steps_done)
            if cfg.run.snapshot_every and (steps_done % cfg.run.snapshot_every == 0 or self.final):
                (self.run_dir / "snapshots").mkdir(exist_ok=True)
                self.on_learners("save_policy", str(self.run_dir / "snapshots" / f"step-{steps_done:06d}.pt"))
            if self.final:
                break
        self.settle_weights()  # the final version reaches every engine before the loops stop and the evaluation
        ends = ray.get([w.stop.remote() for w in self.workers])
        buffer_counts = ray.get(self.buffer.close.remote())
        after = self.evaluate()
        self.on_learners("save", str(self.run_dir / "final_model"), self.learner_model_path)
        return {
            "steps": steps_done, "stopped_by": "steps" if steps_done == cfg.run.steps else "time", "resumed_at_step": self.start_step or None, "wall_s": time.time() - t_start, "policy_version": self.version,
            **eval_summary(before, after),
            "samples": buffer_counts, "rollout": [dataclasses.asdict(e) for e in ends], "rollout_restarts": self.restarts, "placement": self.placement,
            "bottleneck": dataclasses.asdict(bottleneck(history)),
        }

    def step(self, step: int) -> dict:
        """Wait for a batch, train on it, publish the weights every learner.sync_every steps, measure."""
        t0 = time.perf_counter()
        batch = self.next_batch(step)
        waited = time.perf_counter() - t0
        batch_ref = ray.put(batch)  # one copy in the object store, whatever the number of learner workers
        metrics = ray.get([a.train_step.remote(batch_ref, self.version) for a in self.learners])[0]
        self.check_non_finite(step, metrics)
        self.final = step == self.cfg.run.steps - 1 or self.out_of_time()  # the last step publishes its weights
        sync = {"seconds": 0.0, "bytes": 0, "settle_s": 0.0, "send_s": 0.0, "load_s": 0.0}
        if (step + 1) % self.cfg.learner.sync_every == 0 or self.final:
            sync = self.sync_weights()
        if metrics.get("alert/kl"):
            action = "rolled back to the last good weights" if metrics.get("alert/rolled_back") else self.cfg.algorithm.kl_action
            print(f"asyncrl: ALERT step {step}: kl/ref {metrics['kl/ref']:.4f} > {self.cfg.algorithm.kl_alert} ({action})", flush=True)
        step_s = time.perf_counter() - t0
        compute_s = metrics["time/train_end"] - metrics["time/train_start"]
        self.trained_total += len(batch)
        self.learner_compute_total += compute_s * len(self.learners)
        metrics.update(self.rollout_metrics())
        metrics.update(self.reward_metrics())
        metrics.update(self.record_engine_trace(step))
        metrics.update(sync.get("eval", {}))  # a validation started after an earlier step, finished before this step's publish
        metrics.update({"step": step, "policy_version": self.version, **timing_metrics(step_s, waited, compute_s, sync),
                        **sample_totals(self.trained_total, metrics["samples/generated_total"], metrics["rollout/busy_s_total"],
                                        self.learner_compute_total)})
        self.last_histograms = batch_histograms(batch, self.version)
        return metrics

    def out_of_time(self) -> bool:
        """run.max_train_minutes is spent (counted from the first step of this process)."""
        budget_s = self.cfg.run.max_train_minutes * 60
        return budget_s > 0 and time.monotonic() - self.train_t0 >= budget_s

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
            errors = [s.error for s in stats if s.error]
            if errors:
                raise RuntimeError("; ".join(errors))
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no batch within buffer.sample_timeout_s={timeout}s at step {step}; rollout workers: {stats}")

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

    # ---- weights ------------------------------------------------------------------------

    def sync_weights(self) -> dict:
        """Publish the learner's weights as the next version, without waiting for the engines to load it.

        The version published before is settled first (every engine has loaded it, or a worker that died
        doing so is replaced), so at most one version is in flight. The learner's side of the broadcast
        and the engines' loads overlap the next step's training and generation; what is left on the
        controller's path is `seconds`."""
        t_eval = time.perf_counter()
        validated = self.finish_validation()  # the engines hold the version being validated until it is done
        eval_wait = time.perf_counter() - t_eval if validated else 0.0
        t0 = time.perf_counter()
        settled = self.settle_weights()
        waited = time.perf_counter() - t0
        self.version += 1
        sent = self._publish()
        return {"seconds": time.perf_counter() - t0, "settle_s": waited, "eval_wait_s": eval_wait, "eval": validated, **settled, **sent}

    def _publish(self) -> dict:
        sent = self.sync.publish(self.workers, self.version)
        self.buffer.set_version.remote(self.version)  # the buffer's calls run in the order they were sent
        return sent

    def settle_weights(self) -> dict:
        """Block until every engine has loaded the version in flight; replace the ones that died doing it."""
        load_s, dead = self.sync.collect()
        for i in dead:  # rebuilds the group and publishes again, to everyone
            self.replace_worker(i, "died during a weight update")
        return {"load_s": load_s}

    # ---- rollout workers ------------------------------------------------------------------

    def worker_stats(self) -> list[WorkerStats]:
        """Every worker's counters; a worker whose process died is replaced first (and its lost groups recorded)."""
        while True:
            stats, dead = self.rollout.stats()
            if not dead:
                return stats
            for i, why in dead:
                self.replace_worker(i, why)

    def replace_worker(self, i: int, why: str) -> None:
        """Rollout worker i is gone: record what it took with it, start a replacement where it stopped, rebuild the
        weight group around it and give it the current version."""
        self.rollout.retire(i, why)
        self.sync.collect(skip=i)  # the others finish loading the version in flight before the group is rebuilt
        if not self.rollout.restart(i, why):
            self.replace_worker(i, "died while starting")  # bounded by rollout.max_restarts
            return
        self.worker_seen.pop(i, None)  # its counters start again from 0
        self.sync.connect(self.workers, self._rendezvous())
        self._publish()
        self.settle_weights()  # the replacement starts generating from the current version
        ray.get(self.workers[i].start.remote())

    def rollout_metrics(self) -> dict:
        stats = self.worker_stats()
        errors = [s.error for s in stats if s.error]
        if errors:
            raise RuntimeError("; ".join(errors))
        now = time.time()
        buf = ray.get(self.buffer.stats.remote())
        metrics, self.worker_seen = rollout_metrics(stats, buf, self.worker_seen, now - self.tokens_t, self.restarts, self.cfg.rollout.group_size)
        self.tokens_t = now
        return metrics

    def reward_metrics(self) -> dict:
        """The reward pool's step metrics (none without a pool)."""
        if not self.rewards.actors:
            return {}
        stats = self.rewards.stats()
        metrics = reward_metrics(stats, self.reward_seen)
        self.reward_seen.update({s.worker_id: s for s in stats})
        return metrics

    def record_engine_trace(self, step: int) -> dict:
        """Append every worker's engine steps since the last learner step to RUN_DIR/engine_trace.jsonl (one line per
        worker and learner step: wall times and running requests); returns the running-request metrics."""
        traces = [self._trace(ref) for ref in [w.engine_trace.remote() for w in self.workers]]
        with open(self.run_dir / "engine_trace.jsonl", "a") as f:
            for i, trace in enumerate(traces):
                if trace:
                    f.write(json.dumps({"step": step, "worker": i, "t": [round(t, 4) for t, _ in trace], "running": [n for _, n in trace]}) + "\n")
        return engine_running(traces)

    @staticmethod
    def _trace(ref) -> list[tuple[float, int]]:
        """One worker's trace; empty when it died after this step's stats (the next stats call replaces it)."""
        try:
            return ray.get(ref, timeout=60.0)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return []

    def evaluate(self) -> list[float] | None:
        """Each held-out problem's greedy score, in the task's order (None with run.eval off)."""
        if not self.cfg.run.eval:
            return None
        if self.last_validation is not None and self.last_validation[0] == self.version:  # the last step's validation
            return self.last_validation[1]
        return ray.get(self.workers[0].evaluate.remote(self.held_out))

    @functools.cached_property
    def held_out(self) -> list:
        """The task's held-out problems (read once: for a dataset, from its files)."""
        return make_task(self.cfg.task, self.cfg.run.seed, self.cfg.data).eval_prompts()

    def start_validation(self) -> None:
        """Validation during training, started: the held-out problems of the version just published, shared among
        the rollout workers, which generate them next to their training requests (RolloutWorker.evaluate_live). The
        version is settled on every engine first; the learner trains on meanwhile, and the next publish waits for
        the scores (`finish_validation`), so one version is evaluated. No evaluation sample enters the buffer."""
        t0 = time.perf_counter()
        self.settle_weights()
        shares = split_evenly(self.held_out, len(self.workers))
        k = self.cfg.run.eval_pass_k
        refs = [w.evaluate_live.remote(share, k) for w, share in zip(self.workers, shares) if share]
        self.pending_validation = (self.version, refs, t0)

    def finish_validation(self) -> dict:
        """The eval/ metrics of the validation in flight ({} when none); eval/policy_version names the version
        scored, eval/seconds the time from its start to its last score."""
        if self.pending_validation is None:
            return {}
        version, refs, t0 = self.pending_validation
        self.pending_validation = None
        scores = merge(ray.get(refs))
        self.last_validation = (version, scores.greedy)
        return {**eval_metrics(scores), "eval/policy_version": version, "eval/seconds": time.perf_counter() - t0}

    # ---- state ----------------------------------------------------------------------------

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
            "worker_cursors": self.rollout.prompt_cursors(stats),
            "buffer_counts": {k: counts[k] for k in ("admitted_groups", "refused_admissions", "consumed", "dropped_stale", "dropped_error", "aborted", "filtered")},
        }
        return write_checkpoint(self.run_dir, next_step, state, self._write_learner_files, self.cfg.run.keep_checkpoints)

    def _write_learner_files(self, directory: Path) -> None:
        """The learner's part of a checkpoint: its shards (every rank writes its own) and, with run.checkpoint_hf, the
        policy as a Hugging Face directory in hf/ (written as the final model is)."""
        self.on_learners("save_checkpoint", str(directory))
        if self.cfg.run.checkpoint_hf:
            self.on_learners("save", str(directory / CHECKPOINT_HF_DIR), self.learner_model_path)

    # ---- groups -------------------------------------------------------------------------------

    def _rendezvous(self) -> str:
        """Loopback when everything runs on one node, else the learner rank 0's node address."""
        one_node = len({*self.placement["learner_nodes"], *self.placement["rollout_nodes"]}) == 1
        return "127.0.0.1" if one_node else ray.get(self.learner.node_ip.remote())

    def on_learners(self, method: str, *args):
        """Call `method` on every learner rank (FSDP2: gathering or saving the weights is a collective); rank 0's result."""
        return ray.get([getattr(a, method).remote(*args) for a in self.learners])[0]

    def _init_learner_group(self) -> None:
        if len(self.learners) == 1:
            return
        host = self._rendezvous()
        port = ray.get(self.learner.pick_port.remote(host))
        ray.get([a.init_learner_group.remote(host, port, i, len(self.learners)) for i, a in enumerate(self.learners)])

    def shutdown(self) -> None:
        self.rewards.close()
        for actor in [*self.workers, *self.learners, *self.rewards.actors, self.buffer]:
            ray.kill(actor)
        for pg in self.pools:
            remove_placement_group(pg)


def check_plugins(cfg: Config) -> None:
    """Task, reward, algorithm and engine resolve before Ray starts (an error naming the culprit)."""
    if cfg.rollout.engine == "sglang":
        from asyncrl.actors.sglang_engine import check_installed

        check_installed()
    make_task(cfg.task, cfg.run.seed, cfg.data)
    if cfg.task.reward == "reward_model":
        _check_model_dir(cfg.reward.model_path)
    else:
        check_reward_file(cfg.task.reward)
        make_reward(cfg.task.reward)
    get_algorithm(cfg.algorithm.name)


def _check_model_dir(path: str) -> None:
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"reward.model_path={path!r}: not a Hugging Face model directory (no config.json there)")


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
    if (given := requested_address(cfg)) and given != "local":
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
