"""Scoring outside the caller's process: a result cache, and a child process that can be killed.

What a reward says of itself (`@reward`: batched, deterministic, version) is asyncrl.core.reward_traits'.

`ScoringProcess` runs the calls in a child process of its own session (asyncrl.core.child), so that a call past
its timeout, or one that kills its process, is ended for good: the whole process group is killed (SIGKILL), the
samples it held get the reason, and the next call starts a fresh child.
"""
from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.core.child import Child
from asyncrl.core.reward_traits import RewardTraits, traits_of
from asyncrl.core.prompts import Prompt
from asyncrl.core.rewards import make_reward


def cache_key(reward_name: str, version: str, prompt: Prompt, response: str) -> str:
    """The cache's key: the reward's name and version, the prompt (its text, reference answer and record: a reward may
    read any column) and the response."""
    h = hashlib.sha256()
    for part in (reward_name, version, prompt.text, prompt.answer, prompt.record.fingerprint() if prompt.record else "", response):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class RewardCache:
    """Least-recently-used results by key, at most `size` of them; counts hits and misses."""

    def __init__(self, size: int) -> None:
        self.size, self.hits, self.misses = size, 0, 0
        self._items: OrderedDict[str, float] = OrderedDict()

    def get(self, key: str) -> float | None:
        value = self._items.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return value

    def put(self, key: str, value: float) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


@dataclass
class Scored:
    """One sample's outcome: its reward, or why it has none."""
    value: float | None = None
    error: str | None = None


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest-rank rule; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# ---- the child process ------------------------------------------------------------------------

def _child_main(conn, reward_name: str, options: dict) -> None:
    """Score what the parent sends, one message back per call: ("ok", [values]) or ("err", index, message)."""
    try:
        fn = build_reward(reward_name, options)
    except Exception as exc:
        conn.send(("fail", f"reward {reward_name!r} could not be built: {exc!r}"))
        return
    batched = traits_of(fn).batched
    conn.send(("ready",))
    while True:
        try:
            prompts, responses = conn.recv()
        except EOFError:
            return
        if batched:
            try:
                values = [float(v) for v in fn(prompts, responses)]
                if len(values) != len(prompts):
                    raise ValueError(f"batched reward returned {len(values)} values for {len(prompts)} samples")
                conn.send(("ok", values))
            except Exception as exc:  # handed to the parent, which records it
                conn.send(("err", -1, f"reward raised {exc!r}"))
            continue
        for i, (p, r) in enumerate(zip(prompts, responses)):
            try:
                conn.send(("one", i, float(fn(p, r))))
            except Exception as exc:
                conn.send(("err", i, f"reward raised {exc!r}"))


def build_reward(name: str, options: dict) -> Callable:
    """The reward `name` names: a built-in made from `options` (the reward section), or a registered or dotted-path function."""
    if name == "reward_model":
        from asyncrl.core.reward_model import RewardModel  # torch and transformers only where this reward is used
        return RewardModel(options["model_path"], options["device"], options.get("max_length", 512))
    return make_reward(name)


def reward_traits(name: str) -> RewardTraits:
    """What `@reward` says of the reward `name` names (without loading a reward model)."""
    if name == "reward_model":
        from asyncrl.core.reward_model import RewardModel

        return traits_of(RewardModel)
    return traits_of(make_reward(name))


class ScoringProcess:
    """Calls a reward in a child process; a call past `timeout_s`, or one that ends the process, is killed with its
    process group and answered with the reason; the next call starts a fresh child (`restarts` counts them)."""

    def __init__(self, reward_name: str, options: dict, timeout_s: float) -> None:
        self.reward_name, self.options, self.timeout_s = reward_name, options, timeout_s
        self.traits = reward_traits(reward_name)
        self.child: Child | None = None
        self.restarts = self.timeouts = self.crashes = 0

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    @property
    def proc(self):
        return self.child.proc if self.child is not None else None

    @property
    def conn(self):
        return self.child.conn

    def _start(self, startup_s: float) -> str:
        """Start a child and wait for it to have built the reward; "" when it has, else why not."""
        self.child = Child(_child_main, (self.reward_name, self.options), f"asyncrl-reward-{self.reward_name}")
        reply, why = self._next_reply(time.monotonic() + startup_s, counted=False)
        if reply is None:
            return f"reward process did not start: {why}"
        return reply[1] if reply[0] == "fail" else ""

    def close(self) -> None:
        """Kill the child and everything in its process group."""
        if self.child is not None:
            self.child.kill()
        self.child = None

    def score(self, prompts: list[Prompt], responses: list[str], startup_s: float = 300.0) -> list[Scored]:
        """Each pair's reward or the reason it has none, in order. Per-sample rewards get `timeout_s` per sample
        (a hung sample is killed and the rest go on in a fresh child); a batched call gets `timeout_s` in all.
        A new child has `startup_s` to build the reward (imports, a reward model's load) before the clock starts."""
        out: list[Scored] = [Scored() for _ in prompts]
        todo = list(range(len(prompts)))
        while todo:
            if self.proc is None or not self.proc.is_alive():
                if self.proc is not None:
                    self.close()
                    self.restarts += 1
                why = self._start(startup_s)
                if why:
                    for i in todo:
                        out[i] = Scored(error=why)
                    self.close()
                    return out
            self.conn.send(([prompts[i] for i in todo], [responses[i] for i in todo]))
            todo = self._receive(todo, out)
        return out

    def _receive(self, todo: list[int], out: list[Scored]) -> list[int]:
        """Read the child's answers for `todo`; returns the indices left to send again (after a killed child)."""
        expected = 1 if self.traits.batched else len(todo)
        deadline = time.monotonic() + self.timeout_s
        for _ in range(expected):
            reply, why = self._next_reply(deadline)
            if reply is None:
                done = {i for i, s in enumerate(out) if s.value is not None or s.error is not None}
                left = [i for i in todo if i not in done]
                culprits = left if self.traits.batched else left[:1]  # per sample: the one it was scoring
                for i in culprits:
                    out[i] = Scored(error=why)
                self.close()
                self.restarts += 1
                return [i for i in left if i not in culprits]
            kind = reply[0]
            if kind == "ok":
                for i, v in zip(todo, reply[1]):
                    out[i] = Scored(value=v)
            elif kind == "one":
                out[todo[reply[1]]] = Scored(value=reply[2])
            else:
                for i in (todo if reply[1] < 0 else [todo[reply[1]]]):
                    out[i] = Scored(error=reply[2])
            deadline = time.monotonic() + self.timeout_s
        return []

    def _next_reply(self, deadline: float, counted: bool = True) -> tuple[tuple | None, str]:
        """The child's next message, or (None, why) when it timed out or died first (`counted`: in timeouts/crashes)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.timeouts += counted
                return None, f"reward timed out after {self.timeout_s:g} s (its process was killed)"
            try:
                if self.conn.poll(min(left, 0.5)):
                    return self.conn.recv(), ""
            except (EOFError, OSError):  # its end of the pipe closed: it exited
                self.proc.join(5)
            if not self.proc.is_alive():
                self.crashes += counted
                return None, f"reward process died (exit code {self.proc.exitcode})"
