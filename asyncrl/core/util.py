"""Small process helpers shared by the actors and the controller."""
from __future__ import annotations

import os


def pin_to_cores(cores: list[int]) -> list[int]:
    """Pin this process to `cores` that exist here; returns the cores used (empty: unpinned)."""
    usable = [c for c in cores if c in os.sched_getaffinity(0)]
    if usable:
        os.sched_setaffinity(0, usable)
    return usable



def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """This CPU multiplies bf16 in hardware (the `avx512_bf16` or `amx_bf16` flag): bf16 compute is then no slower
    than fp32. Without it PyTorch emulates bf16 matmuls (measured 6x slower than fp32 on an AVX2 EPYC)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def pids_named(prefix: str | tuple[str, ...], environ: str | None = None) -> list[int]:
    """Pids of this machine's processes whose command line starts with `prefix` (or one of them; Ray names actors
    `ray::<Class>`) and, when `environ` ("NAME=value") is given, whose environment holds it."""
    prefixes = tuple(p.encode() for p in ((prefix,) if isinstance(prefix, str) else prefix))
    pids = []
    for proc in os.scandir("/proc"):
        if not proc.name.isdigit():
            continue
        try:
            with open(f"/proc/{proc.name}/cmdline", "rb") as f:
                if not f.read().startswith(prefixes):
                    continue
            if environ is not None:
                with open(f"/proc/{proc.name}/environ", "rb") as f:
                    if environ.encode() not in f.read().split(b"\0"):
                        continue
            pids.append(int(proc.name))
        except OSError:
            continue
    return pids
