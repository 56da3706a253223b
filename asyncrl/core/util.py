"""Small process helpers shared by the actors and the controller."""
from __future__ import annotations

import os


def pin_to_cores(cores: list[int]) -> list[int]:
    """Pin this process to `cores` that exist here; returns the cores used (empty: unpinned)."""
    usable = [c for c in cores if c in os.sched_getaffinity(0)]
    if usable:
        os.sched_setaffinity(0, usable)
    return usable



def pids_named(prefix: str) -> list[int]:
    """Pids of this machine's processes whose command line starts with `prefix` (Ray names actors `ray::<Class>`)."""
    pids = []
    for proc in os.scandir("/proc"):
        if not proc.name.isdigit():
            continue
        try:
            with open(f"/proc/{proc.name}/cmdline", "rb") as f:
                if f.read().startswith(prefix.encode()):
                    pids.append(int(proc.name))
        except OSError:
            continue
    return pids
