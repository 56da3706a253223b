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
    scoring_retries: int = 0  # hand-overs sent again after their reward actor died or was restarting
    reward_hangs: int = 0  # reward actors found hung by the watchdog (no answer within the hand-over deadline), restarted
    bad_prompts: int = 0
    prompts_drawn: int = 0  # the data cursor a checkpoint records
    tool_calls: int = 0  # tool calls of episodes that ended (env.name), run off the loop
    tool_errors: int = 0  # of them, killed at env.tool_timeout_s or ended their process
    tool_s: float = 0.0  # their time in the tool processes
    turns: int = 0  # model turns generated (one per sample without env.name)


@dataclass
class WorkerStats(WorkerCounters):
    """`RolloutWorker.stats()`: its counters and state; an `error` stops the run with that message."""
    worker_id: int = 0
    version: int = 0
    inflight_groups: int = 0
    scoring_groups: int = 0  # handed to the reward pool, not yet delivered
    error: str | None = None


@dataclass(frozen=True)
class LoadReport:
    """An engine's load of one weight version: receive and load seconds, bytes received, and (`learner.verify_weights`)
    the fingerprints of the weights it serves after the load (asyncrl.core.fingerprint; None when the engine cannot
    compute them) and their seconds."""
    version: int
    seconds: float
    bytes: int
    fingerprint: dict | None = None
    verify_s: float = 0.0
    wall_s: float = 0.0  # from the worker's receiving the call to the load's end (its loop may first finish a step or a drain)


@dataclass(frozen=True)
class SentWeights:
    """The learner's end of one weight sync: bytes posted, seconds on the learner, and what the engines need to
    receive it (None for a broadcast; CUDA IPC handles)."""
    bytes: int
    seconds: float
    payload: object = None
    fingerprint: dict | None = None  # name -> the sent tensor's fingerprint (`learner.verify_weights`), rank 0
    fingerprint_s: float = 0.0
    error: str | None = None  # the broadcast broke (a receiver died or froze): nothing of it is loaded anywhere


@dataclass(frozen=True)
class GroupScored:
    """A reward worker's answer for one group, once it reached the buffer: the reason of each sample that has no
    reward ([] when all scored), or `duplicate` when the group had been handed over before (nothing was done)."""
    failures: tuple[str, ...] = ()
    size: int = 0
    duplicate: bool = False

    @property
    def all_failed(self) -> bool:
        return self.size > 0 and len(self.failures) == self.size


@dataclass
class RewardStats:
    """`RewardWorker.stats()`: running totals since it started, and the sample latencies since the last call."""
    worker_id: int = 0
    samples: int = 0  # samples answered (scored, cached or failed)
    scored: int = 0  # samples the reward function was called for
    calls: int = 0  # calls into the reward (a batched reward: one per batch)
    batches: int = 0  # batches taken from the queue
    batched_samples: int = 0  # samples in those batches
    cache_hits: int = 0
    cache_misses: int = 0
    timeouts: int = 0
    crashes: int = 0
    errors: int = 0  # calls that raised
    duplicates: int = 0  # groups handed over twice (ignored)
    busy_s: float = 0.0  # inside reward calls
    wall_s: float = 0.0  # since it started
    groups: int = 0
    group_wait_s: float = 0.0  # summed over groups: handed over -> delivered to the buffer
    queue_depth: int = 0  # samples waiting or being scored now
    latencies: tuple[float, ...] = ()  # seconds from hand-over to result, per sample answered since the last call
