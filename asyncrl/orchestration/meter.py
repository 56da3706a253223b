"""The step metrics read off the actors: each step's counters from the rollout workers, the buffer and the reward
pool, and what is kept between steps to turn them into rates (step_metrics.py does the arithmetic); every engine
step's running requests appended to RUN_DIR/engine_trace.jsonl.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import ray

from asyncrl.core.config import Config
from asyncrl.core.messages import RewardStats, WorkerStats
from asyncrl.orchestration.pools import RewardPool
from asyncrl.orchestration.step_metrics import engine_running, reward_metrics, rollout_metrics, sample_totals


class StepMeter:
    def __init__(self, cfg: Config, run_dir: Path, buffer, rewards: RewardPool, since: float) -> None:
        """`since`: the wall time the first step's rates count from."""
        self.group_size, self.run_dir, self.buffer, self.rewards = cfg.rollout.group_size, run_dir, buffer, rewards
        self.tokens_t = since  # when the workers' counters were read last
        self.worker_seen: dict[int, dict] = {}  # worker id -> counters at the previous step
        self.gone: list[WorkerStats] = []  # the last counters of workers removed from the pool (the totals keep them)
        self.reward_seen: dict[int, RewardStats] = {}  # reward actor id -> its counters at the previous step
        self.trained_total, self.learner_compute_total = 0, 0.0  # checkpointed: a resumed run continues them
        self.histograms: dict[str, list[float]] = {}  # the last batch's (step_metrics.batch_histograms)

    def rollout(self, stats: list[WorkerStats], restarts: int) -> dict:
        """The rollout and buffer metrics from every worker's counters (`stats`) and the buffer's."""
        now = time.time()
        buf = ray.get(self.buffer.stats.remote())
        metrics, self.worker_seen = rollout_metrics(stats, buf, self.worker_seen, now - self.tokens_t, restarts, self.group_size, self.gone)
        self.tokens_t = now
        return metrics

    def forget(self, worker: int) -> None:
        """Worker `worker` was replaced or removed: its counters start again from 0."""
        self.worker_seen.pop(worker, None)

    def left(self, stats: WorkerStats) -> None:
        """A worker removed from the pool stopped with these counters: the run's totals keep them."""
        self.gone.append(stats)

    def reward(self) -> dict:
        """The reward pool's step metrics (none without a pool)."""
        if not self.rewards.actors:
            return {}
        stats = self.rewards.stats()
        metrics = reward_metrics(stats, self.reward_seen)
        self.reward_seen.update({s.worker_id: s for s in stats})
        return metrics

    def trained(self, samples: int, learner_compute_s: float) -> None:
        """Count one step's batch and the learner compute it took (seconds summed over the ranks)."""
        self.trained_total += samples
        self.learner_compute_total += learner_compute_s

    def totals(self, metrics: dict) -> dict:
        """The run's sample totals, from this step's rollout metrics (`metrics`) and the counts so far."""
        return sample_totals(self.trained_total, metrics["samples/generated_total"], metrics["rollout/busy_s_total"],
                             self.learner_compute_total)

    def engine_trace(self, step: int, workers: list) -> dict:
        """Append every worker's engine steps since the last learner step to RUN_DIR/engine_trace.jsonl (one line per
        worker and learner step: wall times and running requests); returns the running-request metrics."""
        traces = [self._trace(ref) for ref in [w.engine_trace.remote() for w in workers]]
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


def raise_errors(stats: list[WorkerStats]) -> None:
    """A rollout worker that reported an error stops the run with it."""
    errors = [s.error for s in stats if s.error]
    if errors:
        raise RuntimeError("; ".join(errors))
