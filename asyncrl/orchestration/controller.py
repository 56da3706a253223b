"""The controller: builds every part from one Config, runs the loop, stops cleanly.

Where each responsibility lives: which cluster and where the pools and the model go (cluster.py), the rollout
workers and their replacement (pools.py), the learner ranks (learners.py), the weight-sync protocol
(weight_sync.py), every actor built, placed and kept on the current weights (fleet.py), per-step metrics as pure
functions (step_metrics.py) and read off the actors (meter.py), evaluation on the held-out problems
(validation.py), checkpoints (checkpointing.py); here, the step loop and the decisions that need more than one of
them.

The loop reads like pseudocode: wait for a batch, train, publish weights every
`learner.sync_every` steps, log. Rollout workers generate on their own the
whole time; the only waits are the ones the staleness bound forces, and they
are measured (`time/learner_wait_s`).
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path

import ray
import yaml

from asyncrl.algorithms import get_algorithm
from asyncrl.analysis.runs import bottleneck, eval_summary
from asyncrl.core.checkpoint import latest_checkpoint, read_state, truncate_metrics
from asyncrl.core.config import Config
from asyncrl.core.deadlines import LearnerLost
from asyncrl.core.metrics import MetricsSink
from asyncrl.core.models import model_source
from asyncrl.core.models.cache import ModelSource
from asyncrl.core.reward_files import check_reward_file
from asyncrl.core.rewards import make_reward
from asyncrl.core.tasks import make_task
from asyncrl.orchestration.alerts import Alerts
from asyncrl.orchestration.checkpointing import Checkpoints
from asyncrl.orchestration.cluster import check_reachable, connect_ray, requested_address
from asyncrl.orchestration.elastic import RunCommands
from asyncrl.orchestration.recovery import LearnerRecovery
from asyncrl.orchestration.fleet import Fleet
from asyncrl.orchestration.meter import StepMeter, raise_errors
from asyncrl.orchestration.step_metrics import batch_histograms, timing_metrics
from asyncrl.orchestration.validation import Validation


class Controller:
    def __init__(self, cfg: Config, run_dir: Path, model: ModelSource, resume: Path | None = None) -> None:
        """Build every part; with `resume` (a checkpoint directory) continue that run's state."""
        self.cfg, self.run_dir = cfg, run_dir
        state = read_state(resume) if resume is not None else {}
        self.run_id = f"{run_dir.name}-{uuid.uuid4().hex[:6]}"
        cursors = {int(k): v for k, v in state.get("worker_cursors", {}).items()}
        self.fleet = Fleet(cfg, run_dir, model, self.run_id, cursors)
        self.buffer = self.fleet.buffer
        self.meter = StepMeter(cfg, run_dir, self.buffer, self.fleet.rewards, since=self.fleet.created_t)
        self.fleet.on_replaced = self.meter.forget
        self.fleet.on_left = self.meter.left
        self.recovery = LearnerRecovery(cfg, run_dir, self.fleet, self.meter)  # a lost learner rank, restored in place
        self.commands = RunCommands(cfg, run_dir, self.run_id, self.fleet.elastic)  # asyncrl scale / stop, rollout.autoscale
        self.validation = Validation(cfg)
        self.checkpoints = Checkpoints(cfg, run_dir, self.buffer, self.fleet.learner_pool, self.fleet.rollout)
        self.non_finite_streak, self.alerts = 0, Alerts(cfg)
        self.final = False  # the step being run is the last (run.steps reached, or run.max_train_minutes spent)
        self.train_t0 = time.monotonic()
        self.start_step = 0
        if resume is not None:
            self._restore(resume, state)
        self.fleet.connect()
        if resume is not None:  # the engines start from the initial model: give them the checkpoint's policy
            self.sync_weights()
            self.settle_weights()

    @property
    def workers(self) -> list:
        return self.fleet.workers

    learners = property(lambda self: self.fleet.learner_pool.actors)  # new actors after a restore (recovery.py)
    learner = property(lambda self: self.learners[0])  # rank 0: it publishes weights and saves

    @property
    def version(self) -> int:
        """The policy version last published."""
        return self.fleet.version

    # ---- the loop ---------------------------------------------------------------------

    def train(self, sink: MetricsSink) -> dict:
        cfg, t_start = self.cfg, time.time()
        before = self.validation.evaluate(self.workers, self.version)
        ray.get([w.start.remote() for w in self.workers])
        history, steps_done = [], self.start_step
        self.train_t0 = time.monotonic()
        step = self.start_step
        while step < cfg.run.steps:
            try:
                self.iteration(step, history, sink)
            except LearnerLost as exc:  # restored in place from the last checkpoint: its steps are redone
                step = self.recovery.restore(step, exc, sink)
                history[:] = [h for h in history if h["step"] < step]
                continue
            steps_done = step + 1
            if self.final:
                break
            step += 1
        self.settle_weights()  # the final version reaches every engine before the loops stop and the evaluation
        ends = ray.get([w.stop.remote() for w in self.workers])
        buffer_counts = ray.get(self.buffer.close.remote())
        after = self.validation.evaluate(self.workers, self.version)
        self.on_learners("save", str(self.run_dir / "final_model"), self.fleet.learner_pool.model_path)
        return {
            "steps": steps_done, "stopped_by": "steps" if steps_done == cfg.run.steps else "command" if self.commands.stopped else "time", "resumed_at_step": self.start_step or None, "wall_s": time.time() - t_start, "policy_version": self.version,
            **eval_summary(before, after),
            "samples": buffer_counts, "rollout": [dataclasses.asdict(e) for e in ends], "rollout_restarts": self.fleet.rollout.restarts, "weight_mismatches": self.fleet.mismatches, "watchdog": self.fleet.watchdog,
            "rollout_workers": len(self.workers), "pool_changes": self.fleet.elastic.records(),
            "learner_restarts": self.recovery.restarts,
            "placement": self.fleet.placement, "bottleneck": dataclasses.asdict(bottleneck(history)),
        }

    def iteration(self, step: int, history: list[dict], sink: MetricsSink) -> None:
        """One step of the loop and what follows it: validation, the metrics row, the autoscaler, checkpoints."""
        cfg = self.cfg
        history.append(self.step(step))
        steps_done, every = step + 1, cfg.run.checkpoint_every
        if cfg.run.eval_every and (steps_done % cfg.run.eval_every == 0 or self.final):
            self.start_validation()
            if self.final:  # nothing follows to overlap it with: its scores are the final evaluation
                history[-1].update(self.validation.finish())
        sink.log(history[-1], histograms=self.meter.histograms)
        if cfg.rollout.autoscale:
            self.commands.autoscale(step, history)
        if every and (steps_done % every == 0 or self.final):
            self.checkpoint(steps_done)
        if cfg.run.snapshot_every and (steps_done % cfg.run.snapshot_every == 0 or self.final):
            (self.run_dir / "snapshots").mkdir(exist_ok=True)
            self.on_learners("save_policy", str(self.run_dir / "snapshots" / f"step-{steps_done:06d}.pt"))

    def step(self, step: int) -> dict:
        """Wait for a batch, train on it, publish the weights every learner.sync_every steps, measure."""
        t0 = time.perf_counter()
        self.fleet.step = step
        batch = self.next_batch(step)
        waited = time.perf_counter() - t0
        batch_ref = ray.put(batch)  # one copy in the object store, whatever the number of learner workers
        metrics = self.on_learners("train_step", batch_ref, self.version)
        self.check_non_finite(step, metrics)
        self.final = step == self.cfg.run.steps - 1 or self.out_of_time() or self.commands.stop_asked()  # the last step publishes its weights
        sync = {"seconds": 0.0, "bytes": 0, "settle_s": 0.0, "send_s": 0.0, "load_s": 0.0}
        if (step + 1) % self.cfg.learner.sync_every == 0 or self.final:
            sync = self.sync_weights()
        for line in self.alerts.check(step, metrics, batch):  # a KL alert; every answer cut and masked, batch after batch
            print(line, flush=True)
        step_s = time.perf_counter() - t0
        compute_s = metrics["time/train_end"] - metrics["time/train_start"]
        self.meter.trained(len(batch), compute_s * len(self.learners))
        stats = self.fleet.worker_stats()
        raise_errors(stats)
        metrics.update(self.meter.rollout(stats, self.fleet.rollout.restarts))
        metrics.update(self.meter.reward())
        metrics.update(self.meter.engine_trace(step, self.workers))
        metrics.update(sync.get("eval", {}))  # a validation started after an earlier step, finished before this step's publish
        metrics.update({"step": step, "policy_version": self.version, **timing_metrics(step_s, waited, compute_s, sync), **self.meter.totals(metrics)})
        metrics.update(self.commands.step(step, sync.get("pool_s", 0.0)))
        metrics["learner/restarts_total"] = len(self.recovery.restarts)
        self.meter.histograms = batch_histograms(batch, self.version)
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
            stats = self.fleet.worker_stats()
            raise_errors(stats)
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

    # ---- weights and validation -----------------------------------------------------------

    def sync_weights(self) -> dict:
        """Publish the learner's weights as the next version, without waiting for the engines to load it.

        The version published before is settled first (every engine has loaded it, or a worker that died
        doing so is replaced), so at most one version is in flight. The learner's side of the broadcast
        and the engines' loads overlap the next step's training and generation; what is left on the
        controller's path is `seconds`."""
        t_eval = time.perf_counter()
        validated = self.validation.finish()  # the engines hold the version being validated until it is done
        eval_wait = time.perf_counter() - t_eval if validated else 0.0
        return {**self.fleet.publish_next(), "eval_wait_s": eval_wait, "eval": validated}

    def settle_weights(self) -> dict:
        """Block until every engine has loaded the version in flight and verify it (Fleet.settle_weights)."""
        return self.fleet.settle_weights()

    def start_validation(self) -> None:
        """Validation during training (validation.py) of the version just published, settled on every engine first;
        the learner trains on meanwhile, and the next publish waits for the scores, so one version is evaluated."""
        t0 = time.perf_counter()
        self.settle_weights()
        self.validation.start(self.fleet.elastic.serving, self.version, t0)

    # ---- state ----------------------------------------------------------------------------

    def _restore(self, checkpoint: Path, state: dict) -> None:
        self.checkpoints.restore(checkpoint, state)
        self.start_step, self.fleet.version = state["next_step"], state["version"]
        self.meter.trained_total, self.meter.learner_compute_total = state["trained_total"], state["learner_compute_total"]

    def checkpoint(self, next_step: int) -> Path:
        """Everything needed to continue at `next_step` (checkpointing.py); the trajectory record is flushed first."""
        stats = self.fleet.worker_stats()
        progress = {"version": self.version, "run_id": self.run_id, "trained_total": self.meter.trained_total,
                    "learner_compute_total": self.meter.learner_compute_total}
        return self.checkpoints.save(next_step, progress, stats)

    def on_learners(self, method: str, *args):
        """Call `method` on every learner rank (FSDP2: gathering or saving the weights is a collective); rank 0's result."""
        return self.fleet.learner_pool.call(method, *args)

    def shutdown(self) -> None:
        self.commands.close()
        self.fleet.shutdown()


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
