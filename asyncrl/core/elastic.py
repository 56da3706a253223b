"""The elastic rollout pool's decisions, as pure functions: whether a requested size is allowed, what the
autoscaler asks for, and how a change is written down.

The pool changes one step at a time, at the top: workers 0..n-1 serve, a new one takes index n, a removed one is
the last (its id, prompt stream and group numbering continue if it comes back). The fleet carries the changes out
(asyncrl/orchestration/fleet.py) at version boundaries, so every engine in the weight group holds the same version.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Bounds:
    """[lo, hi] rollout workers; hi None: no bound but the cluster's."""
    lo: int
    hi: int | None
    why_hi: str = "rollout.max_workers"  # what sets hi, for the error

    @staticmethod
    def of(min_workers: int, max_workers: int, endpoint_port: int = 0) -> Bounds:
        """From the config: rollout.min_workers / max_workers (0: none); a fixed env.endpoint_port serves one worker."""
        if endpoint_port:
            return Bounds(min_workers, 1, f"env.endpoint_port={endpoint_port} (a fixed port serves one rollout worker; use 0)")
        return Bounds(min_workers, max_workers or None)


def target_error(target: int, bounds: Bounds) -> str | None:
    """Why `target` rollout workers may not be asked for (None: it may)."""
    if target < bounds.lo:
        return f"{target} rollout workers is below rollout.min_workers={bounds.lo}"
    if bounds.hi is not None and target > bounds.hi:
        return f"{target} rollout workers is above the most allowed, {bounds.hi} ({bounds.why_hi})"
    return None


def autoscale_target(verdict: str, workers: int, bounds: Bounds) -> int:
    """The pool size the autoscaler asks for, from the bottleneck verdict over its window (asyncrl.analysis.runs
    .bottleneck): one more worker while generation-bound, one fewer while training-bound, within the bounds."""
    if verdict == "generation-bound" and (bounds.hi is None or workers < bounds.hi):
        return workers + 1
    if verdict == "training-bound" and workers > bounds.lo:
        return workers - 1
    return workers


@dataclass
class PoolChange:
    """One change of the pool, as the summary and the log keep it."""
    step: int  # the learner step during which it was asked for
    before: int
    after: int
    why: str  # "command" or "autoscale: <verdict>"
    done_step: int | None = None  # the step at whose version boundary the last worker joined or left
    seconds: float = 0.0  # from the request to the change in place (engine start and drains included)
    boundary_s: float = 0.0  # of it, on the learner's path: the group re-formed and the joiners' first load
    error: str | None = None  # a worker that could not be started (the pool stays as it was)

    def record(self) -> dict:
        return asdict(self)
