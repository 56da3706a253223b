"""The reward hand-off: a finished group's records get their rewards and go to the buffer, one of three ways.

- `InLoopScoring`: the task's reward, called on a few threads with a timeout (asyncrl.core.reward_runner), from
  the loop (no reward pool).
- `EnvironmentScoring`: an environment's or an agent's episodes bring their own reward; a tool or agent that
  failed drops the group.
- the reward pool (actors/rollout/pool_scoring.py): the group goes to a reward actor, which scores it and
  delivers it to the buffer while the loop goes on.

GRPO needs whole groups: one sample that fails scoring drops its group as dropped_error. `FailureStreak` stops
the run when every sample of `task.max_consecutive_reward_failures` groups in a row failed."""
from __future__ import annotations

import time
from typing import Callable, Protocol

from asyncrl.actors.rollout.records import dropped
from asyncrl.actors.rollout.state import Group
from asyncrl.core.messages import WorkerCounters
from asyncrl.core.prompts import Prompt
from asyncrl.core.reward_runner import RewardRunner, RewardThreadsStuck, RewardTimeout
from asyncrl.core.schema import Status


class Scoring(Protocol):
    """Where the loop hands a finished group (`records` in sample order, not yet scored)."""

    stuck: int  # reward threads held by calls that timed out

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

    stuck = 0

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
    """The task's reward (`task.reward`) on `runner`'s threads, each call bounded by task.reward_timeout_s."""

    def __init__(self, runner: RewardRunner, put, streak: FailureStreak, counters: WorkerCounters) -> None:
        super().__init__(put, streak, counters)
        self.runner = runner

    @property
    def stuck(self) -> int:
        return self.runner.stuck

    def score(self, group: Group, record: dict) -> str | None:
        try:
            record["reward"] = self.runner(group.prompt, record["response_text"])
        except RewardThreadsStuck as exc:  # no reward can run any more: this worker is done
            self.streak.fail(f"reward {self.streak.reward!r}: {exc}")
            return str(exc)
        except RewardTimeout as exc:
            self.counters.reward_timeouts += 1
            return str(exc)
        except Exception as exc:  # a user reward failing must not kill the worker
            self.counters.reward_errors += 1
            return f"reward raised {exc!r}"
        return None

    def score_texts(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        return [self.runner(p, r) for p, r in zip(prompts, responses)]


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

    stuck = 0

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
