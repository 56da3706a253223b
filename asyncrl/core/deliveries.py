"""Which groups each rollout worker was admitted for and which it delivered, by group number (`GroupId`).

The replay buffer keeps one: a group delivered twice (e.g. late from a worker already declared dead) is
recognised, the groups a dead worker took with it can be named and recorded (forfeit), and the groups still in
flight are known with the version their worker held when they were admitted (`in_flight`: the replay buffer's
batches wait for one about to go stale).
"""
from __future__ import annotations

from asyncrl.core.messages import GroupId


class Deliveries:
    def __init__(self) -> None:
        self.admitted_by: dict[int, int] = {}  # per worker: groups admitted (= its next group number)
        self.delivered_by: dict[int, set[int]] = {}  # per worker: the group numbers it delivered
        self.flying: dict[tuple[int, int], int] = {}  # (worker, group number) admitted, not delivered: its worker's version then

    def admitted(self, worker_id: int, n: int, version: int | None = None) -> None:
        """`n` more groups for the worker; `version`: the one its engine held (None: not known, not tracked in flight)."""
        first = self.admitted_by.get(worker_id, 0)
        self.admitted_by[worker_id] = first + n
        if version is not None:
            self.flying.update({(worker_id, k): version for k in range(first, first + n)})

    def in_flight(self) -> list[int]:
        """The admission versions of the groups admitted with a known version and not delivered yet."""
        return list(self.flying.values())

    def first(self, group: list[dict]) -> bool:
        """Note the group as delivered; False if it already was."""
        worker, gid = group[0]["worker_id"], GroupId.parse(group[0]["group_id"])
        if gid is None:  # not made by a rollout worker
            return True
        number = gid.number
        seen = self.delivered_by.setdefault(worker, set())
        if number in seen:
            return False
        seen.add(number)
        self.flying.pop((worker, number), None)
        return True

    def forfeit(self, worker_id: int) -> tuple[int, list[int]]:
        """The worker's admitted group count, and the numbers of those it never delivered (noted as delivered now:
        they are recorded once)."""
        admitted = self.admitted_by.get(worker_id, 0)
        delivered = self.delivered_by.setdefault(worker_id, set())
        lost = [k for k in range(admitted) if k not in delivered]
        delivered.update(lost)
        for k in lost:
            self.flying.pop((worker_id, k), None)
        return admitted, lost
