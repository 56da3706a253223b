"""Calling a reward function off the caller's thread, with a timeout per call (the rollout loop's rewards)."""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, wait

from asyncrl.core.prompts import Prompt, RewardFn


class RewardTimeout(Exception):
    """A reward call ran past its timeout (its thread may still be running it)."""


class RewardThreadsStuck(RuntimeError):
    """Every reward thread is still inside a call that timed out: no reward can run."""


class RewardRunner:
    """Calls a reward function on a few daemon threads, with a timeout per call.

    ``runner(prompt, response)`` returns the reward as a float, raises what the
    function raises, `RewardTimeout` when it takes longer than `timeout_s`, and
    `RewardThreadsStuck` when no thread is left to run it. The caller still
    waits for the call (up to `timeout_s`), so a slow reward slows generation,
    but a hung one cannot block it forever.

    Python cannot kill a thread: a call that timed out is abandoned, not
    stopped, and its thread stays busy until the function returns, maybe
    never. The damage is bounded by `threads`: once every thread is held by
    such a call, each further call raises `RewardThreadsStuck` at once (the
    rollout worker then reports an error). The threads are daemons, so a hung
    call does not keep the process from exiting. Calls are meant to come one at
    a time (from the rollout loop, or from evaluation while the loop is
    stopped); concurrent callers are serialised.
    """

    def __init__(self, fn: RewardFn, timeout_s: float = 30.0, threads: int = 4, name: str = "reward") -> None:
        if timeout_s <= 0:
            raise ValueError(f"reward timeout must be > 0 s, got {timeout_s}")
        if threads < 1:
            raise ValueError(f"reward threads must be >= 1, got {threads}")
        self.fn, self.timeout_s, self.threads, self.name = fn, timeout_s, threads, name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._abandoned: list[Future] = []  # calls that timed out, maybe still running
        self._started = 0

    @property
    def stuck(self) -> int:
        """Threads still inside a call that timed out (safe to read from any thread)."""
        return sum(not f.done() for f in list(self._abandoned))

    def __call__(self, prompt: Prompt, response: str) -> float:
        with self._lock:
            self._abandoned = [f for f in self._abandoned if not f.done()]
            if self.stuck >= self.threads:
                raise RewardThreadsStuck(
                    f"all {self.threads} reward threads are stuck in calls that ran past {self.timeout_s:g} s (Python cannot stop them)"
                )
            if self._started < self.threads and self._started <= self.stuck:  # every started thread is held: start another
                threading.Thread(target=self._serve, name=f"{self.name}-{self._started}", daemon=True).start()
                self._started += 1
            future: Future = Future()
            self._calls.put((future, prompt, response))
            if not wait([future], timeout=self.timeout_s).done:
                if not future.cancel():  # already running: its thread is held until the call returns
                    self._abandoned.append(future)
                raise RewardTimeout(f"reward timed out after {self.timeout_s:g} s")
        return float(future.result())  # raises what the function raised

    def _serve(self) -> None:
        while True:
            future, prompt, response = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self.fn(prompt, response))
            except Exception as exc:  # handed to the caller
                future.set_exception(exc)
            except BaseException as exc:  # SystemExit and the like: the caller gets an ordinary error, the thread lives on
                future.set_exception(RuntimeError(f"{exc!r}"))
