"""The staleness policy, as pure functions.

Definitions (PRIME-RL style, precise on purpose):

- The learner's *version* V counts published weight updates: the engines start
  at version 0 and receive V+1 when the learner publishes after
  `learner.sync_every` steps.
- A sample's *staleness* when trained on is ``V - policy_version_start``: how
  many published versions behind the learner the first token of the sample
  was generated. It is trained on only if staleness <= `buffer.max_staleness`.
- *Admission* (AReaL's rule) stops rollouts from running ahead of what the
  learner can consume within the bound: at version V the learner will have
  consumed at most ``(V + max_staleness + 1) * groups_per_version`` groups by
  the time it reaches version V + max_staleness, so no more live groups than
  that may have been started.
- A worker whose engine holds an older version than the learner's minus
  ``max_staleness`` is not admitted at all: whatever it started now would
  already be stale when trained on. At ``max_staleness=0`` this makes the run
  strictly synchronous: a worker starts the next batch only once it has
  loaded the weights that batch will be trained against.
- A *group* is judged whole, by its oldest sample's start version
  (``oldest_start``): ``split_stale`` drops it entirely or keeps it, and
  ``take_batch`` (with ``buffer.oldest_first``) hands the oldest groups to the
  learner first.
- A group is *expiring* at learner version V when its staleness is exactly
  ``max_staleness``: V is the last version that may train on it. Where one is
  still being generated when the last batch of V is asked for, the batch
  waits for it (``waits_for_expiring``, up to `buffer.expiring_wait_s`)
  rather than take newer groups and leave it to be dropped: the groups that
  reach that point are the long ones, and dropping them trains the policy on
  shorter responses than it writes.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence


def staleness(learner_version: int, policy_version_start: int) -> int:
    """Published versions between the sample's first token and the learner."""
    return learner_version - policy_version_start


def is_stale(learner_version: int, policy_version_start: int, max_staleness: int) -> bool:
    return staleness(learner_version, policy_version_start) > max_staleness


def admission_capacity(version: int, max_staleness: int, groups_per_version: int) -> int:
    """Live groups (started and not dropped) allowed while the learner is at `version`."""
    return (version + max_staleness + 1) * groups_per_version


def admissible(
    requested: int,
    live_groups: int,
    outstanding_groups: int,
    version: int,
    max_staleness: int,
    groups_per_version: int,
    capacity_groups: int,
    worker_version: int | None = None,
) -> int:
    """How many of `requested` new groups may start now (0..requested).

    `live_groups` counts every group ever admitted minus those dropped;
    `outstanding_groups` are admitted and not yet consumed or dropped (in
    flight or buffered); they may not exceed `capacity_groups`.
    `worker_version`: the version the asking engine holds (None: not known);
    none is admitted while it is more than `max_staleness` behind `version`.
    """
    if worker_version is not None and is_stale(version, worker_version, max_staleness):
        return 0
    by_staleness = admission_capacity(version, max_staleness, groups_per_version) - live_groups
    by_capacity = capacity_groups - outstanding_groups
    return max(0, min(requested, by_staleness, by_capacity))


def oldest_start(group: list[dict]) -> int:
    """A group's start version: its oldest sample's (a group is judged whole, by it)."""
    return min(s["policy_version_start"] for s in group)


def expiring(learner_version: int, policy_version_start: int, max_staleness: int) -> bool:
    """`learner_version` is the last version that may train on a sample (or group) started at `policy_version_start`."""
    return staleness(learner_version, policy_version_start) == max_staleness


def waits_for_expiring(in_flight: Iterable[int], buffered: Iterable[int], version: int, max_staleness: int, n_groups: int,
                       last_at_version: bool) -> bool:
    """Whether a batch of `n_groups` at learner `version` should wait for groups still in flight.

    `in_flight`: the start versions of the groups being generated (the version each one's worker held when it was
    admitted: a lower bound); `buffered`: those of the fresh groups ready. It waits where this is the last batch at
    `version` (`last_at_version`: the learner publishes after it), an in-flight group is expiring, and the ready
    expiring groups (which an oldest-first batch takes first) do not fill the batch on their own."""
    if not last_at_version or not any(expiring(version, s, max_staleness) for s in in_flight):
        return False
    return sum(expiring(version, s, max_staleness) for s in buffered) < n_groups


def split_stale(groups: Iterable[list[dict]], version: int, max_staleness: int) -> tuple[list[list[dict]], list[tuple[list[dict], str]]]:
    """`groups` still fresh at learner `version`, and those past `max_staleness` with the reason (order kept)."""
    fresh, stale = [], []
    for group in groups:
        oldest = oldest_start(group)
        if is_stale(version, oldest, max_staleness):
            stale.append((group, f"group staleness {version - oldest} > {max_staleness}"))
        else:
            fresh.append(group)
    return fresh, stale


def take_batch(groups: Sequence[list[dict]], n: int, oldest_first: bool) -> tuple[list[list[dict]], list[list[dict]]]:
    """The `n` groups a batch takes and those left (in arrival order): the oldest by start version first with
    `oldest_first` (ties and otherwise: arrival order)."""
    order = list(range(len(groups)))
    if oldest_first:
        order.sort(key=lambda i: oldest_start(groups[i]))  # stable: arrival order within a version
    chosen = set(order[:n])
    return [groups[i] for i in order[:n]], [g for i, g in enumerate(groups) if i not in chosen]
