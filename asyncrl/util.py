"""Small process helpers shared by the actors and the controller."""
from __future__ import annotations

import os


def pin_to_cores(cores: list[int]) -> list[int]:
    """Pin this process to `cores` that exist here; returns the cores used (empty: unpinned)."""
    usable = [c for c in cores if c in os.sched_getaffinity(0)]
    if usable:
        os.sched_setaffinity(0, usable)
    return usable

