"""Small process helpers shared by the actors and the controller."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager


def pin_to_cores(cores: list[int]) -> list[int]:
    """Pin this process to `cores` that exist here; returns the cores used (empty: unpinned)."""
    usable = [c for c in cores if c in os.sched_getaffinity(0)]
    if usable:
        os.sched_setaffinity(0, usable)
    return usable


@contextmanager
def timer(out: dict[str, float], key: str) -> Iterator[None]:
    """Adds the seconds spent in the block to out[key]."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        out[key] = out.get(key, 0.0) + time.perf_counter() - t0
