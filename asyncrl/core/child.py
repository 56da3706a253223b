"""A child process that can be killed for good: what runs user code that may hang (rewards, an environment's tools).

`Child` spawns `target(conn, *args)` in a fresh interpreter (never a fork: the parent runs threads) as the
leader of its own session, set to die with its parent (PR_SET_PDEATHSIG). `kill` SIGKILLs its whole process
group, so whatever the user's code started goes with it. Python threads cannot be stopped; processes can.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
from collections.abc import Callable


def die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies (an actor killed with SIGKILL leaves no child)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _enter(target: Callable, conn, args: tuple) -> None:
    os.setsid()  # its own process group: a kill ends whatever the target started too
    die_with_parent()
    target(conn, *args)


class Child:
    """`target(conn, *args)` in a spawned process; the parent talks to it through `conn` (a Pipe end)."""

    def __init__(self, target: Callable, args: tuple, name: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_enter, args=(target, child, args), daemon=True, name=name)
        self.proc.start()
        child.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc.is_alive() else None

    def alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        """SIGKILL the child's process group and reap it (the child itself too: one killed before its `setsid` has no
        group of its own yet)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()
