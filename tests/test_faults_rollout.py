"""Faults in a rollout worker are counted drops, not crashes, and nothing goes unrecorded.

Fast: the count of groups in a row whose reward failed (the in-loop reward
hand-off alone, over an in-process stand-in for its scoring process).
Slow (a real engine on the random tiny model, its real reward process and a
real ReplayBuffer actor, no learner): a reward that hangs past
`task.reward_timeout_s` call after call, a reward that always raises, and
empty or over-long prompts in the prompt stream. Each slow
test reads the trajectory store at the end: every sample recorded exactly once.
"""
from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest
import ray

from asyncrl.actors.buffer import ReplayBuffer
from asyncrl.actors.rollout.records import sample_record
from asyncrl.actors.rollout.scoring import FailureStreak, InLoopScoring
from asyncrl.actors.rollout.state import Group, SampleState
from asyncrl.actors.rollout.worker import RolloutWorker
from asyncrl.core.config import load_config
from asyncrl.core.episode import SingleTurn
from asyncrl.core.messages import GroupId, WorkerCounters
from asyncrl.core.store import read_trajectories
from asyncrl.core.prompts import Prompt
from asyncrl.core.scoring import Scored

slow = pytest.mark.slow
GROUP = 4
PROMPT = Prompt("1+2", "1+2=", "3")


# ---- rewards the workers load by dotted path (tests.test_faults_rollout.<name>) -------------

HANGS = "ASYNCRL_TEST_HANGS"
"""The environment variable naming a file that holds how many more calls of hanging_reward hang (the reward runs in
the worker's reward process, so its count lives in a file)."""


def hanging_reward(prompt: Prompt, response: str) -> float:
    """Hangs for an hour on the next N calls (N from the file named by $ASYNCRL_TEST_HANGS, counted down there),
    then scores 0.0 at once."""
    path = os.environ.get(HANGS)
    if path and int(Path(path).read_text()) > 0:
        Path(path).write_text(str(int(Path(path).read_text()) - 1))
        time.sleep(3600)
    return 0.0


def failing_reward(prompt: Prompt, response: str) -> float:
    raise ValueError("boom")


# ---- fast: the in-loop hand-off's accounting ------------------------------------------------------


class InProcessScorer:
    """Stands in for the worker's reward process (asyncrl.core.scoring.ScoringProcess, exercised by the slow tests
    below): the same answers, in this process, for the hand-off's accounting alone."""

    timeout_s = 5.0

    def __init__(self, fn) -> None:
        self.fn = fn

    def score(self, prompts: list[Prompt], responses: list[str]) -> list[Scored]:
        out = []
        for p, r in zip(prompts, responses):
            try:
                out.append(Scored(value=float(self.fn(p, r))))
            except Exception as exc:  # noqa: BLE001 - as the reward process reports it
                out.append(Scored(error=f"reward raised {exc!r}"))
        return out


class Scorer:
    """The in-loop reward hand-off with its failure streak, as a worker builds it, putting into a list."""

    def __init__(self, reward, max_failures: int) -> None:
        self.put, self.error, self.counters = [], None, WorkerCounters()
        self.streak = FailureStreak(max_failures, "my.reward", self.fail)
        self.scoring = InLoopScoring(InProcessScorer(reward), self.put.append, self.streak, self.counters)

    def fail(self, why: str) -> None:
        self.error = self.error or f"rollout worker 0: {why}"

    def score(self, group: Group) -> list[dict]:
        records = [sample_record("t", 0, group, group.samples[sid], lambda ids: "x" * len(ids)) for sid in sorted(group.samples)]
        self.scoring.hand_off(group, records)
        deadline = time.monotonic() + 10
        while len(self.scoring) and time.monotonic() < deadline:  # scored on the hand-off's thread, delivered at a check
            self.scoring.check()
            time.sleep(0.001)
        return self.put[-1]


def finished_group(n: int) -> Group:
    group = Group(GroupId("t", 0, n), PROMPT, [1, 2], time.time())
    for i in range(GROUP):
        sid = group.gid.sample_id(i)
        driver = SingleTurn([1, 2], 8)
        driver.model_turn([5] * (i + 1), [-1.0] * (i + 1), [0] * (i + 1), "stop")
        group.samples[sid] = SampleState(sid, driver, 0, ended=(0, time.time()))
    return group


def test_reward_failing_for_every_sample_of_n_groups_in_a_row_is_an_error():
    fail = {"on": True}

    def reward(prompt: Prompt, response: str) -> float:
        if fail["on"] or len(response) == 1:  # with fail off, only each group's first sample fails
            raise ValueError("boom")
        return 1.0

    worker = Scorer(reward, max_failures=3)
    for g in range(2):
        rows = worker.score(finished_group(g))
        assert {(r["status"], r["status_reason"]) for r in rows} == {("dropped_error", "reward raised ValueError('boom')")}
    assert worker.streak.count == 2 and worker.error is None

    fail["on"] = False  # a group where some samples score: dropped as a whole, but the reward works
    rows = worker.score(finished_group(100))
    assert [r["status_reason"] for r in rows] == ["reward raised ValueError('boom')"] + ["a sample of its group failed"] * 3
    assert [r["reward"] for r in rows] == [None, 1.0, 1.0, 1.0]
    assert worker.streak.count == 0 and worker.error is None

    fail["on"] = True
    for g in range(3):
        assert worker.error is None
        worker.score(finished_group(200 + g))
    assert worker.error == ("rollout worker 0: reward 'my.reward' failed for the last 3 groups: reward raised ValueError('boom')")
    assert worker.counters.reward_errors == 5 * GROUP + 1


# ---- slow: a real engine and buffer -----------------------------------------------------------


def make_worker(model_dir: str, store_dir: Path, reward: str, *overrides: str, **task_attrs) -> tuple[RolloutWorker, object]:
    cfg = load_config(None, [f"rollout.group_size={GROUP}", "rollout.max_new_tokens=8", "rollout.max_inflight_groups=2",
                             "learner.batch_size=8", "learner.micro_batch_size=8", "buffer.capacity_groups=4",
                             f"task.reward={reward}", *overrides])
    for key, value in task_attrs.items():  # task.reward_timeout_s etc., read with getattr until config declares them
        setattr(cfg.task, key, value)
    buffer = ray.remote(ReplayBuffer).remote(cfg, str(store_dir))
    return RolloutWorker(0, cfg, model_dir, buffer, "t"), buffer


def wait_for(condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def stop_and_read(worker: RolloutWorker, buffer, store_dir: Path) -> tuple[dict, dict, list[dict]]:
    """Stop the worker and the buffer; the worker's stats, the buffer's counts before close, and every record."""
    end = worker.stop()
    counts = ray.get(buffer.stats.remote())
    ray.get(buffer.close.remote())
    rows = read_trajectories(store_dir).to_pylist()
    assert len(rows) == len({r["sample_id"] for r in rows}) == worker.flight.next_group * GROUP  # every sample of every group, once
    assert all(r["status"] for r in rows)
    return end, counts, rows


@slow
def test_a_reward_that_hangs_call_after_call_is_killed_each_time_and_the_loop_goes_on(random_model_dir, ray_local, tmp_path, monkeypatch):
    """Six calls hang for an hour: more than the 4 reward threads the loop once had, whose stuck calls ended the run."""
    hangs = tmp_path / "hangs"
    hangs.write_text("6")
    monkeypatch.setenv(HANGS, str(hangs))  # the worker's reward process inherits it
    worker, buffer = make_worker(random_model_dir, tmp_path / "traj", "tests.test_faults_rollout.hanging_reward", reward_timeout_s=0.2)
    assert worker.scoring.scorer.timeout_s == 0.2
    worker.start()
    wait_for(lambda: worker.counters.groups_done >= 5)
    assert worker.stats().error is None and worker.thread.is_alive()
    end, _, rows = stop_and_read(worker, buffer, tmp_path / "traj")

    assert hangs.read_text() == "0" and end.reward_timeouts == 6 and end.reward_errors == 0 and end.error is None
    timed_out = [r for r in rows if r["status_reason"] == "reward timed out after 0.2 s (its process was killed)"]
    assert len(timed_out) == 6 and len({r["group_id"] for r in timed_out}) == 2  # a whole group, then half the next
    groups = [r for r in rows if r["group_id"] in {t["group_id"] for t in timed_out}]
    assert {r["status"] for r in groups} == {"dropped_error"} and all(r["reward"] is None for r in timed_out)
    assert sorted(r["status_reason"] for r in groups if r not in timed_out) == ["a sample of its group failed"] * 2
    scored = [r for r in rows if r["status"] == "unconsumed_at_end"]
    assert len(scored) >= 3 * GROUP and {r["reward"] for r in scored} == {0.0}  # groups after them were scored normally
    assert {r["status"] for r in rows} <= {"dropped_error", "unconsumed_at_end", "aborted_at_end"}


@slow
def test_a_reward_that_always_fails_stops_the_worker_with_an_error(random_model_dir, ray_local, tmp_path):
    worker, buffer = make_worker(random_model_dir, tmp_path / "traj", "tests.test_faults_rollout.failing_reward",
                                 max_consecutive_reward_failures=3)
    worker.start()
    wait_for(lambda: worker.stats().error is not None)
    error = worker.stats().error
    assert error == ("rollout worker 0: reward 'tests.test_faults_rollout.failing_reward' failed for the last 3 groups: "
                     "reward raised ValueError('boom')")
    worker.thread.join(10)
    assert not worker.thread.is_alive()  # the loop ended: no generating for nothing
    end, counts, rows = stop_and_read(worker, buffer, tmp_path / "traj")
    assert end.groups_done >= 3 and end.reward_errors == end.groups_done * GROUP
    dropped = [r for r in rows if r["status"] == "dropped_error"]
    assert len(dropped) == counts["dropped_error"] == end.reward_errors
    assert {r["status_reason"] for r in dropped} == {"reward raised ValueError('boom')"}
    assert counts["outstanding_groups"] == counts["buffered_groups"] == 0


@slow
def test_empty_and_overlong_prompts_are_counted_drops(random_model_dir, ray_local, tmp_path):
    worker, buffer = make_worker(random_model_dir, tmp_path / "traj", "exact_match")
    long_text = "12345+" * 20 + "1="
    n_long = len(worker.engine.tokenizer(long_text).input_ids)
    assert n_long > worker.maker.max_prompt == 56
    good = (Prompt(f"{i}+1", f"{i}+1=", str(i + 1)) for i in itertools.count())
    worker.flight.prompts = itertools.chain(
        [next(good), Prompt("empty", "", "0"), next(good), Prompt("long", long_text, "0"), next(good)], good
    )
    worker.start()
    # capacity_groups=4: the loop fills the buffer with 4 good groups, the bad ones freeing their admission
    wait_for(lambda: ray.get(buffer.stats.remote())["buffered_groups"] == 4)
    assert worker.stats().bad_prompts == 2 and worker.stats().error is None
    batch = ray.get(buffer.get_batch.remote(2, 0, 0, 10.0))  # the good groups are trained on as usual
    assert len(batch) == 2 * GROUP
    end, counts, rows = stop_and_read(worker, buffer, tmp_path / "traj")

    assert end.bad_prompts == 2 and end.groups_started == worker.flight.next_group - 2
    by_prompt = {}
    for r in rows:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    limit = "the limit is 56 (model.max_model_len - rollout.max_new_tokens)"
    for pid, reason in [("empty", "empty prompt"), ("long", f"prompt encodes to {n_long} tokens; {limit}")]:
        group = by_prompt[pid]
        assert len(group) == GROUP and len({r["group_id"] for r in group}) == 1
        assert {(r["status"], r["status_reason"]) for r in group} == {("dropped_error", reason)}
        assert all(r["response_ids"] == [] and r["t_generated"] is None for r in group)
    assert counts["dropped_error"] == 2 * GROUP
    assert counts["outstanding_groups"] == counts["buffered_groups"]  # admission accounting: the bad groups were returned
    consumed = [r for r in rows if r["status"] == "consumed"]
    assert len(consumed) == 2 * GROUP and all(r["prompt_id"] not in ("empty", "long") and r["response_ids"] for r in consumed)
    assert {r["status"] for r in rows} <= {"dropped_error", "consumed", "unconsumed_at_end", "aborted_at_end"}
