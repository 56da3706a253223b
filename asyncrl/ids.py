"""The ids a rollout worker gives its groups and samples, built and parsed here only.

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
