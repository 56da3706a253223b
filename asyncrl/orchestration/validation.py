"""Evaluation on the task's held-out problems: before and after training (one rollout worker, greedy), and
validation during training (run.eval_every), shared among the rollout workers and overlapped with the next step.

The controller decides when: it settles the version to score on every engine before `start`, and the next publish
waits for `finish` (the engines hold the version being validated until it is done).
"""
from __future__ import annotations

import functools
import time

import ray

from asyncrl.core.config import Config
from asyncrl.core.evaluation import eval_metrics, merge, split_evenly
from asyncrl.core.tasks import make_task


class Validation:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.last: tuple[int, list[float]] | None = None  # (version, each held-out problem's greedy score)
        self.pending: tuple[int, list, float] | None = None  # (version, the workers' refs, start): run.eval_every

    def evaluate(self, workers: list, version: int) -> list[float] | None:
        """Each held-out problem's greedy score, in the task's order (None with run.eval off)."""
        if not self.cfg.run.eval:
            return None
        if self.last is not None and self.last[0] == version:  # the last step's validation
            return self.last[1]
        return ray.get(workers[0].evaluate.remote(self.held_out))

    @functools.cached_property
    def held_out(self) -> list:
        """The task's held-out problems (read once: for a dataset, from its files)."""
        return make_task(self.cfg.task, self.cfg.run.seed, self.cfg.data).eval_prompts()

    def start(self, workers: list, version: int, t0: float) -> None:
        """Validation during training, started at `t0`: the held-out problems of `version`, settled on every engine,
        shared among the rollout workers, which generate them next to their training requests
        (RolloutWorker.evaluate_live). No evaluation sample enters the buffer."""
        shares = split_evenly(self.held_out, len(workers))
        k = self.cfg.run.eval_pass_k
        refs = [w.evaluate_live.remote(share, k) for w, share in zip(workers, shares) if share]
        self.pending = (version, refs, t0)

    def finish(self) -> dict:
        """The eval/ metrics of the validation in flight ({} when none); eval/policy_version names the version
        scored, eval/seconds the time from its start to its last score."""
        if self.pending is None:
            return {}
        version, refs, t0 = self.pending
        self.pending = None
        scores = merge(ray.get(refs))
        self.last = (version, scores.greedy)
        return {**eval_metrics(scores), "eval/policy_version": version, "eval/seconds": time.perf_counter() - t0}
