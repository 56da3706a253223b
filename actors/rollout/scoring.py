"""The reward hand-off: a finished group's records get their rewards and go to the buffer, one of three ways.

- `InLoopScoring`: the task's reward, called from the loop (no reward pool) in a child process of the worker that
  is killed when a call runs past its timeout (asyncrl.core.scoring.ScoringProcess, the reward pool's).
- `EnvironmentScoring`: an environment's or an agent's episodes bring their own reward; a tool or agent that
  failed drops the group.
- the reward pool (actors/rollout/pool_scoring.py): the group goes to a reward actor, which scores it and
  delivers it to the buffer while the loop goes on.

GRPO needs whole groups: one sample that fails scoring drops its group as dropped_error. `FailureStreak` stops
the run when every sample of `task.max_consecutive_reward_failures` groups in a row failed."""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Protocol

from asyncrl.actors.rollout.records import dropped
from asyncrl.actors.rollout.state import Group
from asyncrl.core.messages import WorkerCounters
from asyncrl.core.prompts import Prompt
from asyncrl.core.scoring import ScoringProcess
from asyncrl.core.schema import Status


class Scoring(Protocol):
    """Where the loop hands a finished group (`records` in sample order, not yet scored)."""

    def hand_off(self, group: Group, records: list[dict]) -> None: ...

    def check(self) -> None: ...  # take what came back (the pool); called every SCORING_CHECK_S

    def finish(self, timeout_s: float) -> list[dict]: ...  # at stop: the records still being scored, marked aborted

    def score_texts(self, prompts: list[Prompt], responses: list[str]) -> list[float]: ...  # an evaluation's

    def __len__(self) -> int: ...  # groups handed off and not yet delivered


class FailureStreak:
    """Counts groups in a row whose every sample failed scoring; at `limit` it reports an error through `fail`."""

    def __init__(self, limit: int, reward: str, fail: Callable[[str], None]) -> None:
        self.limit, self.reward, self.fail, self.count = limit, reward, fail, 0

    def __call__(self, all_failed: bool, reason: str) -> None:
        self.count = self.count + 1 if all_failed else 0
        if self.count >= self.limit:
            self.fail(f"reward {self.reward!r} failed for the last {self.count} groups: {reason}")


class _Local:
    """Scores on the loop's thread, then puts the group: the in-loop and the environment's variants."""

    def __init__(self, put: Callable[[list[dict]], None], streak: FailureStreak, counters: WorkerCounters) -> None:
        self.put, self.streak, self.counters = put, streak, counters

    def hand_off(self, group: Group, records: list[dict]) -> None:
        failed = []
        for record in records:
            reason = self.score(group, record)
            if reason is not None:
                failed.append(reason)
                record.update(status=Status.DROPPED_ERROR.value, status_reason=reason)
            record["t_scored"] = time.time()
        self.deliver(records, failed)

    def deliver(self, records: list[dict], failed: list[str]) -> None:
        """Put a scored group (`failed`: the reasons of its samples without a reward; any drops the whole group)."""
        if failed:
            dropped(records, "a sample of its group failed")
        self.streak(len(failed) == len(records), failed[-1] if failed else "")
        self.put(records)

    def score(self, group: Group, record: dict) -> str | None:
        """Set the record's reward; returns why it has none."""
        raise NotImplementedError

    def check(self) -> None:
        pass

    def finish(self, timeout_s: float) -> list[dict]:
        return []

    def __len__(self) -> int:
        return 0


class InLoopScoring(_Local):
    """The task's reward (`task.reward`) in `scorer`'s child process, a group a call, on a thread of the worker: the
    loop hands a group over and goes on generating; `check` (the loop's, every SCORING_CHECK_S) delivers what was
    scored. A call past task.reward_timeout_s, or one that ends its process, is killed with everything it started
    and its sample recorded with the reason; the next call gets a fresh child, so a reward that hangs again and
    again costs its samples, never the worker. Groups handed over and not yet delivered count in `len`, as the
    reward pool's do."""

    def __init__(self, scorer: ScoringProcess, put, streak: FailureStreak, counters: WorkerCounters) -> None:
        super().__init__(put, streak, counters)
        self.scorer = scorer
        self.lock = threading.Lock()  # one call at a time into the reward process (the thread's, an evaluation's)
        self.todo: queue.SimpleQueue = queue.SimpleQueue()  # (epoch, prompt, records) to score
        self.done: queue.SimpleQueue = queue.SimpleQueue()  # (epoch, records, results) scored
        self.outstanding: dict[int, list[dict]] = {}  # handed over, not yet delivered, by id (the loop's thread only)
        self.epoch = 0  # groups of an earlier epoch were given up at `finish`: neither scored nor delivered
        self.thread: threading.Thread | None = None

    def hand_off(self, group: Group, records: list[dict]) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, name="reward", daemon=True)
            self.thread.start()
        self.outstanding[id(records)] = records
        self.todo.put((self.epoch, group.prompt, records))

    def _serve(self) -> None:
        while True:
            epoch, prompt, records = self.todo.get()
            if epoch != self.epoch:
                continue
            with self.lock:
                results = self.scorer.score([prompt] * len(records), [r["response_text"] for r in records])
            self.done.put((epoch, records, results))

    def check(self) -> None:
        while True:
            try:
                epoch, records, results = self.done.get_nowait()
            except queue.Empty:
                return
            if epoch != self.epoch:
                continue
            del self.outstanding[id(records)]
            self._deliver(records, results)

    def _deliver(self, records: list[dict], results: list) -> None:
        failed = []
        for record, res in zip(records, results):
            record["reward"] = res.value
            if res.error is not None:
                failed.append(res.error)
                record.update(status=Status.DROPPED_ERROR.value, status_reason=res.error)
                if res.error.startswith("reward timed out"):
                    self.counters.reward_timeouts += 1
                else:  # it raised, ended its process, or could not be built
                    self.counters.reward_errors += 1
            record["t_scored"] = time.time()
        self.deliver(records, failed)

    def finish(self, timeout_s: float) -> list[dict]:
        """At stop: deliver what is scored within `timeout_s`; the groups still waiting or being scored are given up,
        returned marked aborted (a call under way is let finish, its answer ignored)."""
        deadline = time.monotonic() + timeout_s
        while self.outstanding and time.monotonic() < deadline:
            self.check()
            if self.outstanding:
                time.sleep(0.005)
        records = [r for group in self.outstanding.values() for r in group]
        self.outstanding.clear()
        self.epoch += 1
        for r in records:
            r.update(status=Status.ABORTED_AT_END.value, status_reason="run stopped while its group was being scored")
        return records

    def __len__(self) -> int:
        return len(self.outstanding)

    def score_texts(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        with self.lock:
            results = self.scorer.score(prompts, responses)
        if failed := next((res.error for res in results if res.error is not None), None):
            raise RuntimeError(f"reward {self.streak.reward!r}: {failed}")
        return [res.value for res in results]


class EnvironmentScoring(_Local):
    """The episode's own reward (its environment's, or what its agent returned); a tool or an agent that timed out
    or crashed (finish reason tool_error) leaves the sample without one."""

    def score(self, group: Group, record: dict) -> str | None:
        driver = group.samples[record["sample_id"]].driver
        if driver.finish_reason == "tool_error":
            record["reward"] = None
            return driver.end.reason
        record["reward"] = driver.end.reward
        return None

    def score_texts(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        raise ValueError("an environment's episodes are scored by their environment (RolloutWorker.episodes)")


class Captured:
    """The offline loop's hand-off (RolloutWorker.episodes): finished groups kept in the order they finished,
    nothing scored or put."""

    def __init__(self) -> None:
        self.groups: list[Group] = []

    def hand_off(self, group: Group, records: list[dict]) -> None:
        self.groups.append(group)

    def check(self) -> None:
        pass

    def finish(self, timeout_s: float) -> list[dict]:
        return []

    def score_texts(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        raise ValueError("an offline run scores nothing")

    def __len__(self) -> int:
        return 0
