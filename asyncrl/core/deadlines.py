"""Deadlines for the step loop's waits, from the times measured so far: a stage that takes far longer than it ever
has is reported in words (which actor, which call, for how long, against what deadline) instead of waiting forever.

A stage's deadline is `factor` times the longest of its last `window` durations, at least `floor_s`; before any
duration is known, `first_s` (a first weight load includes the engine's warm-up; a first step, compilation).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class StageClock:
    factor: float = 10.0
    floor_s: float = 60.0
    first_s: float = 900.0
    window: int = 20
    seen: dict[str, deque] = field(default_factory=dict)

    def record(self, stage: str, seconds: float) -> None:
        self.seen.setdefault(stage, deque(maxlen=self.window)).append(seconds)

    def deadline(self, stage: str) -> float:
        """Seconds the stage may take before it counts as hung."""
        past = self.seen.get(stage)
        if not past:
            return self.first_s
        return max(self.floor_s, self.factor * max(past))

    def basis(self, stage: str) -> str:
        """How the deadline was set, in words."""
        past = self.seen.get(stage)
        if not past:
            return f"run.hang_first_s: {stage} not timed yet"
        return f"{self.factor:g} x its longest of the last {len(past)} ({max(past):.2f} s), at least {self.floor_s:g} s"


class LearnerLost(RuntimeError):
    """A learner rank died, or hung past its deadline (StageTimeout): the group cannot go on as it is; the
    controller restores it in place from the last checkpoint (learner.max_restarts) or stops."""


class StageTimeout(LearnerLost):
    """A stage of the step loop ran past its deadline (the watchdog's report is the message)."""


def hung_message(who: str, call: str, waited_s: float, clock: StageClock, stage: str, doing: str = "") -> str:
    """The watchdog's report: `rollout worker 1 did not finish update_weights (version 3, loading weights) in 62 s:
    the deadline was ... `."""
    what = f" ({doing})" if doing else ""
    return f"{who} did not finish {call}{what} in {waited_s:.0f} s: the deadline was {clock.deadline(stage):.0f} s ({clock.basis(stage)})"
