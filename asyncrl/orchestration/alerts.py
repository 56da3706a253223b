"""What the driver's console says needs a person: the KL alert the learner raised, and a run that trains on nothing
because every answer was cut and masked. Pure logic; the controller prints the lines."""
from __future__ import annotations

from asyncrl.core.config import Config

FROZEN_AFTER = 3
"""Batches in a row with every answer cut and masked before the alert (then every 10 more while it lasts)."""


def all_cut_and_masked(finish_reasons: list[str], mask_truncated: bool) -> bool:
    """Every answer of the batch was cut at rollout.max_new_tokens and `algorithm.mask_truncated` gives it no loss:
    the step's gradient is zero, and a policy that only writes such answers cannot learn its way back."""
    return mask_truncated and bool(finish_reasons) and all(f == "length" for f in finish_reasons)


class Alerts:
    """Alert lines for each step, from its metrics and its batch (the streak of frozen batches is kept here)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.frozen_streak = 0

    def check(self, step: int, metrics: dict, batch: list[dict]) -> list[str]:
        lines = []
        if metrics.get("alert/kl"):
            action = "rolled back to the last good weights" if metrics.get("alert/rolled_back") else self.cfg.algorithm.kl_action
            lines.append(f"asyncrl: ALERT step {step}: kl/ref {metrics['kl/ref']:.4f} > {self.cfg.algorithm.kl_alert} ({action})")
        frozen = all_cut_and_masked([s["finish_reason"] for s in batch], self.cfg.algorithm.mask_truncated)
        self.frozen_streak = self.frozen_streak + 1 if frozen else 0
        if self.frozen_streak >= FROZEN_AFTER and (self.frozen_streak - FROZEN_AFTER) % 10 == 0:
            lines.append(f"asyncrl: ALERT step {step}: {self.frozen_streak} batches in a row had every answer cut at "
                         f"rollout.max_new_tokens={self.cfg.rollout.max_new_tokens} and algorithm.mask_truncated leaves "
                         "them no loss: these steps train on nothing, and the policy cannot shorten its answers from "
                         "them. Raise rollout.max_new_tokens, add algorithm.overlong_penalty (with overlong_buffer), "
                         "turn mask_truncated off, or lower learner.lr (docs/algorithms.md, over-long responses)")
        return lines
