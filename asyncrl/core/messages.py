"""What the actors tell each other, as small typed records: group and sample ids, a rollout worker's counters, a
weight load's report, what the learner's end of a weight sync sent.

The ids a rollout worker gives its groups and samples are built and parsed here only.

A group id is `<run_id>-w<worker>-g<n>` (the worker's n-th admitted group), a sample id `<group_id>-<i>`. The
buffer de-duplicates deliveries by (worker, n) and names the groups a dead worker took with it by the same
numbers, so a change to the format must go through `GroupId`: `parse(str(g)) == g` is tested.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_GROUP = re.compile(r"^(?P<run>.+)-w(?P<worker>\d+)-g(?P<n>\d+)$")


@dataclass(frozen=True)
class GroupId:
    run_id: str
    worker: int
    number: int

    def __str__(self) -> str:
        return f"{self.run_id}-w{self.worker}-g{self.number}"

    def sample_id(self, index: int) -> str:
        return f"{self}-{index}"

    @classmethod
    def parse(cls, group_id: str) -> GroupId | None:
        """The parts of a rollout worker's group id; None for an id made otherwise."""
        m = _GROUP.match(group_id)
        return cls(m["run"], int(m["worker"]), int(m["n"])) if m else None


def group_of(sample_id: str) -> str:
    """The group id of a sample id (`<group_id>-<index>`)."""
    return sample_id.rsplit("-", 1)[0]


@dataclass
class WorkerCounters:
    """A rollout worker's running totals since it started (a replacement starts again from 0)."""
    groups_started: int = 0
    groups_done: int = 0
    tokens: int = 0
    busy_s: float = 0.0  # stepping the engine
    idle_s: float = 0.0  # waiting for admission
    weight_updates: int = 0
    resubmitted: int = 0  # samples aborted at an update and started again (rollout.weight_update=abort or resume)
    resumed_tokens: int = 0  # tokens sampled before an update that resume kept (none regenerated)
    drain_s: float = 0.0
    update_s: float = 0.0
    loop_s: float = 0.0
    reward_errors: int = 0
    reward_timeouts: int = 0
    bad_prompts: int = 0
    prompts_drawn: int = 0  # the data cursor a checkpoint records


@dataclass
class WorkerStats(WorkerCounters):
    """`RolloutWorker.stats()`: its counters and state; an `error` stops the run with that message."""
    worker_id: int = 0
    version: int = 0
    inflight_groups: int = 0
    reward_threads_stuck: int = 0
    error: str | None = None


@dataclass(frozen=True)
class LoadReport:
    """An engine's load of one weight version: receive and load seconds, bytes received."""
    version: int
    seconds: float
    bytes: int


@dataclass(frozen=True)
class SentWeights:
    """The learner's end of one weight sync: bytes posted, seconds on the learner, and what the engines need to
    receive it (None for a broadcast; CUDA IPC handles)."""
    bytes: int
    seconds: float
    payload: object = None
