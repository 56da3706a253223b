"""A run's checkpoints from the controller's side: the state its actors hold (the learner ranks' shards, the
buffer's accounting, each rollout worker's prompt cursor) gathered with the controller's counters into one
checkpoint, and put back when the run resumes. The files and their atomic write are asyncrl.core.checkpoint's.
"""
from __future__ import annotations

from pathlib import Path

import ray

from asyncrl.core.checkpoint import write_checkpoint
from asyncrl.core.config import Config
from asyncrl.core.messages import WorkerStats
from asyncrl.orchestration.learners import LearnerPool
from asyncrl.orchestration.pools import RolloutPool

BUFFER_COUNTS = ("admitted_groups", "refused_admissions", "consumed", "dropped_stale", "dropped_error", "aborted", "filtered",
                 "expiring_wait_batches", "expiring_wait_s")
"""The buffer's counters a resumed run continues from (the expiring-group waits' totals among them)."""


class Checkpoints:
    def __init__(self, cfg: Config, run_dir: Path, buffer, learners: LearnerPool, rollout: RolloutPool) -> None:
        self.cfg, self.run_dir, self.buffer, self.learners, self.rollout = cfg, run_dir, buffer, learners, rollout

    def save(self, next_step: int, progress: dict, stats: list[WorkerStats]) -> Path:
        """The checkpoint to continue at `next_step`: `progress` (the controller's version, run id and sample totals),
        each worker's prompt cursor from its `stats`, the buffer's counts; the trajectory record is flushed first."""
        ray.get(self.buffer.flush.remote())
        counts = ray.get(self.buffer.stats.remote())
        state = {
            "next_step": next_step, **progress,
            "worker_cursors": self.rollout.prompt_cursors(stats),
            "buffer_counts": {k: counts[k] for k in BUFFER_COUNTS},
        }
        return write_checkpoint(self.run_dir, next_step, state, self.learners.save_checkpoint, self.cfg.run.keep_checkpoints)

    def restore(self, checkpoint: Path, state: dict) -> None:
        """The learner ranks and the buffer as `state` (read from `checkpoint`) left them."""
        self.learners.load_checkpoint(checkpoint)
        consumed_groups = state["trained_total"] // self.cfg.rollout.group_size
        ray.get(self.buffer.restore.remote(state["version"], consumed_groups, state["buffer_counts"]))
