"""An environment's tools, run off the rollout loop: a few child processes, each one call at a time.

`ToolPool.submit` queues a call and returns at once; `poll` (called by the loop between engine steps) hands the
queued calls to idle processes and returns the calls that ended, never blocking. A call past `timeout_s` is
killed with its process group (asyncrl.core.child) and answered with the reason, and its process is replaced; so
is one whose process died. A tool is a top-level `str -> str` function in its environment's `tools`, looked up
by name in the child (which imports the environment itself), so nothing of the episode crosses to it but the
argument.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from asyncrl.core.child import Child

STARTUP_S = 120.0
"""How long a new tool process may take to import its environment before the pool reports an error."""


@dataclass(frozen=True)
class ToolOutcome:
    """A call that ended: its result, or why it has none; `seconds` from its start in a process."""

    key: object
    result: str | None
    error: str | None
    seconds: float


def _tool_main(conn, env_name: str, agent: str = "") -> None:
    """Run the calls the parent sends, ("tool", argument) -> ("ok", result) each (a raising tool's error is its result).
    With `agent` (env.agent, asyncrl.core.agents) the one tool is "agent": the user's agent on a JSON task."""
    import json

    from asyncrl.core.envs import make_environment
    from asyncrl.core.plugins import load_object

    try:
        if agent:
            fn = load_object(agent)
            tools = {"agent": lambda argument: fn(json.loads(argument))}
        else:
            tools = make_environment(env_name).tools
    except Exception as exc:
        conn.send(("fail", f"{'agent ' + agent if agent else f'environment {env_name!r}'} could not be loaded for its tools: {exc!r}"))
        return
    conn.send(("ready",))
    while True:
        try:
            name, argument = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", str(tools[name](argument))))
        except Exception as exc:  # a tool's own error is shown to the model, as a tool result
            conn.send(("ok", f"error: {exc!r}"))


@dataclass
class _Slot:
    child: Child
    ready: bool = False
    started: float = 0.0
    call: tuple | None = None  # (key, name, t0) while it runs one


class ToolPool:
    def __init__(self, env_name: str, size: int, timeout_s: float, agent: str = "", timeout_key: str = "env.tool_timeout_s") -> None:
        """`agent`: run the user's agent (env.agent) instead of an environment's tools; `timeout_key`: the setting
        a timeout's message names."""
        self.env_name, self.size, self.timeout_s, self.agent, self.timeout_key = env_name, size, timeout_s, agent, timeout_key
        self.queue: deque[tuple[object, str, str]] = deque()
        self.slots = [self._new_slot() for _ in range(size)]
        self.calls = self.timeouts = self.crashes = 0
        self.busy_s = 0.0

    def _new_slot(self) -> _Slot:
        return _Slot(Child(_tool_main, (self.env_name, self.agent), f"asyncrl-tools-{self.env_name}"), started=time.monotonic())

    def submit(self, key: object, name: str, argument: str) -> None:
        """Queue the call `name(argument)`; its outcome comes back from a later `poll` under `key`."""
        self.queue.append((key, name, argument))

    def pending(self) -> int:
        """Calls queued or running."""
        return len(self.queue) + sum(s.call is not None for s in self.slots)

    def poll(self) -> list[ToolOutcome]:
        """The calls that ended since the last poll; starts queued ones on idle processes. Never blocks."""
        ended: list[ToolOutcome] = []
        now = time.monotonic()
        for i, slot in enumerate(self.slots):
            if not slot.ready:
                self._check_start(slot, now)
            elif slot.call is not None:
                outcome = self._check_call(slot, now)
                if outcome is not None:
                    ended.append(outcome)
                    if outcome.error is not None:  # killed or dead: a fresh process takes its place
                        slot.child.kill()
                        self.slots[i] = slot = self._new_slot()
            if slot.ready and slot.call is None and self.queue:
                key, name, argument = self.queue.popleft()
                slot.child.conn.send((name, argument))
                slot.call = (key, name, time.monotonic())
                self.calls += 1
        return ended

    def _check_start(self, slot: _Slot, now: float) -> None:
        reply = None
        try:
            if slot.child.conn.poll():
                reply = slot.child.conn.recv()
        except (EOFError, OSError):
            pass
        if reply is not None and reply[0] == "ready":
            slot.ready = True
        elif reply is not None:
            raise RuntimeError(reply[1])
        elif not slot.child.alive():
            raise RuntimeError(f"a tool process of environment {self.env_name!r} died at start (exit code {slot.child.proc.exitcode})")
        elif now - slot.started > STARTUP_S:
            raise RuntimeError(f"a tool process of environment {self.env_name!r} did not start within {STARTUP_S:g} s")

    def _check_call(self, slot: _Slot, now: float) -> ToolOutcome | None:
        key, name, t0 = slot.call
        try:
            if slot.child.conn.poll():
                _, result = slot.child.conn.recv()
                slot.call = None
                self.busy_s += now - t0
                return ToolOutcome(key, result, None, now - t0)
        except (EOFError, OSError):
            pass
        why = None
        if not slot.child.alive():
            self.crashes += 1
            why = f"tool {name!r} ended its process (exit code {slot.child.proc.exitcode})"
        elif now - t0 > self.timeout_s:
            self.timeouts += 1
            why = f"tool {name!r} timed out after {self.timeout_s:g} s ({self.timeout_key}; its process was killed)"
        if why is None:
            return None
        slot.call = None
        self.busy_s += now - t0
        return ToolOutcome(key, None, why, now - t0)

    def pids(self) -> list[int]:
        return [s.child.pid for s in self.slots if s.child.pid is not None]

    def close(self) -> None:
        for slot in self.slots:
            slot.child.kill()
        self.slots = []
