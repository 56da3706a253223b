"""The generation loop (actors/rollout/loop.py) stepped by hand with a fake engine, a fake buffer and in-process
tools: no Ray, no model. Each weight-update mode, an episode restarted by abort, admission, bad prompts, and what
a stop records."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from itertools import count
from types import SimpleNamespace

import pytest

from asyncrl.actors.engine import Finished
from asyncrl.actors.rollout.episodes import EpisodeMaker
from asyncrl.actors.rollout.flight import Flight
from asyncrl.actors.rollout.loop import GenerationLoop
from asyncrl.actors.rollout.scoring import EnvironmentScoring, FailureStreak, InLoopScoring
from asyncrl.actors.rollout.updates import POLICIES
from asyncrl.core.agents import AgentEnvironment
from asyncrl.core.config import load_config
from asyncrl.core.messages import WorkerCounters
from asyncrl.core.prompts import Prompt
from asyncrl.core.tools import ToolOutcome
from tests.envs_fixture import ScriptedEnv
from tests.test_faults_rollout import InProcessScorer

LP = -0.5  # every fake token's log-prob


class FakeTokenizer:
    eos_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = True):
        return SimpleNamespace(input_ids=[1 + ord(c) % 50 for c in text])

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


class FakeEngine:
    """Each step samples one token (id 7) for every running request, which finishes at its max_tokens ("length")."""

    def __init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.requests: dict[str, tuple[list[int], object, list[int]]] = {}
        self.added: list[tuple[str, list[int], int]] = []  # (request id, prompt ids, max tokens) of every add
        self.aborted: list[str] = []
        self.loads = 0

    def sampling_params(self, temperature: float, top_p: float, max_tokens: int, stop: tuple[str, ...] = ()):
        return SimpleNamespace(temperature=temperature, max_tokens=max_tokens, stop=stop)

    def add(self, request_id: str, prompt_ids: list[int], params, priority: int = 0) -> None:
        assert request_id not in self.requests
        self.requests[request_id] = (prompt_ids, params, [])
        self.added.append((request_id, list(prompt_ids), params.max_tokens))

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def num_unfinished(self) -> int:
        return len(self.requests)

    def step(self) -> list[Finished]:
        done = []
        for rid, (_, params, toks) in list(self.requests.items()):
            toks.append(7)
            if len(toks) >= params.max_tokens:
                del self.requests[rid]
                done.append(Finished(rid, toks, [LP] * len(toks), "length"))
        return done

    def generated(self, request_id: str) -> int:
        return len(self.requests[request_id][2])

    def abort(self, request_ids: list[str]) -> list[Finished]:
        self.aborted += request_ids
        outs = []
        for rid in request_ids:
            if rid in self.requests:
                toks = self.requests.pop(rid)[2]
                outs.append(Finished(rid, toks, [LP] * len(toks), "abort"))
        return outs

    @contextlib.contextmanager
    def paused(self):
        yield

    def receive_weights(self, payload=None, keep_kv: bool = False) -> int:
        self.loads += 1
        return 0


class FakeBuffer:
    """Grants up to `groups` groups in all; keeps what is put and the versions it was told of."""

    def __init__(self, groups: int) -> None:
        self.left, self.answer, self.records, self.versions, self.asks = groups, None, [], [], []

    @property
    def asking(self) -> bool:
        return self.answer is not None

    def ask(self, room: int, version: int) -> None:
        self.asks.append((room, version))
        self.answer = min(room, self.left)
        self.left -= self.answer

    def granted(self, timeout_s: float = 0.0):
        answer, self.answer = self.answer, None
        return answer

    def wait(self, timeout_s: float) -> None:
        pass

    def loaded(self, version: int) -> None:
        self.versions.append(version)

    def put(self, records: list[dict]) -> None:
        self.records += records


class InlineTools:
    """Tools run at once, in-process: an outcome per call, handed back on the next poll."""

    def __init__(self, tools: dict) -> None:
        self.tools, self.outcomes, self.calls = tools, [], 0

    def submit(self, key, name: str, argument: str) -> None:
        self.calls += 1
        self.outcomes.append(ToolOutcome(key, self.tools[name](argument), None, 0.0))

    def poll(self) -> list[ToolOutcome]:
        out, self.outcomes = self.outcomes, []
        return out

    def pending(self) -> int:
        return len(self.outcomes)


def prompts():
    for i in count():
        yield Prompt(f"p{i}", f"{i}+1=", str(i + 1))


def make_loop(mode: str, *overrides: str, groups: int = 1, group_size: int = 2, max_new: int = 6, env=None, prompt_stream=None):
    cfg = load_config(None, [f"rollout.weight_update={mode}", f"rollout.group_size={group_size}", f"rollout.max_new_tokens={max_new}",
                             *overrides])
    engine, buffer, counters = FakeEngine(), FakeBuffer(groups), WorkerCounters()
    maker = EpisodeMaker(cfg, engine.tokenizer, env, False)
    streak = FailureStreak(3, "reward", lambda why: None)
    scoring = (EnvironmentScoring(buffer.put, streak, counters) if env else
               InLoopScoring(InProcessScorer(lambda p, r: float(len(r) % 2)), buffer.put, streak, counters))
    tools = InlineTools(env.tools) if env else None
    flight = Flight(engine, maker, scoring, buffer.put, tools, prompt_stream or prompts(), counters, run_id="t", worker_id=0,
                    group_size=group_size, sampling=(1.0, 1.0))
    return GenerationLoop(flight, buffer, POLICIES[mode], max_inflight=groups), engine, buffer


def steps(loop: GenerationLoop, n: int) -> None:
    for _ in range(n):
        loop.step()


def finish(loop: GenerationLoop) -> None:
    """Pass until every group has ended and been scored (in-loop rewards score on a thread: delivered at a check)."""
    for _ in range(2000):
        if not loop.flight.groups and not len(loop.flight.scoring):
            return
        loop.one_pass()
    raise AssertionError("the loop did not finish its groups")


def started(mode: str, **kw):
    """A loop with one admitted group of 2 samples, 2 tokens into their 6 (the update comes now)."""
    loop, engine, buffer = make_loop(mode, **kw)
    loop.admit()
    loop.admit()  # the answer: the group starts
    assert len(loop.flight) == 1 and sorted(loop.flight.running()) == ["t-w0-g0-0", "t-w0-g0-1"]
    steps(loop, 2)
    return loop, engine, buffer


def test_keep_lets_running_samples_go_on_under_the_new_version():
    loop, engine, buffer = started("keep")
    loop.load(1)
    assert engine.aborted == [] and loop.counters.resubmitted == 0 and buffer.versions == [1]
    finish(loop)
    assert len(buffer.records) == 2
    for r in buffer.records:
        assert r["token_versions"] == [0, 0, 1, 1, 1, 1] and (r["policy_version_start"], r["policy_version_end"]) == (0, 1)
        assert r["behavior_logprobs"] == [LP] * 6 and r["finish_reason"] == "length" and r["reward"] == 0.0


def test_abort_throws_the_partial_tokens_away_and_starts_again_from_the_prompt():
    loop, engine, buffer = started("abort")
    loop.load(1)
    assert sorted(engine.aborted) == ["t-w0-g0-0", "t-w0-g0-1"] and loop.counters.resubmitted == 2
    restarts = [a for a in engine.added if a[0] == "t-w0-g0-0"]
    assert restarts[1][1] == restarts[0][1] and restarts[1][2] == 6  # the prompt alone, the whole budget
    finish(loop)
    for r in buffer.records:
        assert r["token_versions"] == [1] * 6 and (r["policy_version_start"], r["policy_version_end"]) == (1, 1)


def test_resume_keeps_the_sampled_tokens_and_asks_only_for_the_rest():
    loop, engine, buffer = started("resume")
    loop.load(1)
    assert loop.counters.resumed_tokens == 4 and loop.counters.resubmitted == 2
    first, again = [a for a in engine.added if a[0] == "t-w0-g0-0"]
    assert again[1] == first[1] + [7, 7] and again[2] == 4  # prompt + the 2 kept tokens, 4 left
    finish(loop)
    for r in buffer.records:
        assert r["response_ids"] == [7] * 6 and r["token_versions"] == [0, 0, 1, 1, 1, 1]
        assert len(r["behavior_logprobs"]) == 6 and (r["policy_version_start"], r["policy_version_end"]) == (0, 1)


def test_drain_lets_running_samples_finish_on_the_old_weights_first():
    loop, engine, buffer = started("drain")
    loop.load(1)
    assert engine.aborted == [] and loop.counters.drain_s > 0 and not engine.has_unfinished()
    assert not loop.flight.groups and buffer.versions == [1]  # finished before the load (delivered once scored)
    finish(loop)
    assert len(buffer.records) == 2
    for r in buffer.records:
        assert r["token_versions"] == [0] * 6 and (r["policy_version_start"], r["policy_version_end"]) == (0, 0)


def test_abort_restarts_an_episode_from_its_first_turn_with_a_fresh_environment():
    loop, engine, buffer = make_loop("abort", "env.name=tests.envs_fixture.ScriptedEnv", "env.max_episode_tokens=40", env=ScriptedEnv, max_new=3)
    loop.admit()
    loop.admit()
    steps(loop, 3)  # turn 1 ends with a tool call, answered in-process
    loop.flight.advance()  # its outcome comes in; turn 2 is submitted
    state = loop.flight.sample("t-w0-g0-0")
    assert state.driver.episode.model_turns() == 1 and state.attempt == 0
    steps(loop, 1)
    loop.load(1)
    state = loop.flight.sample("t-w0-g0-0")
    assert state.attempt == 1 and state.driver.episode.turns == [] and loop.counters.resubmitted == 2
    finish(loop)
    for r in buffer.records:  # every model token is the new version's, the episode played to its end again
        assert {v for v, m in zip(r["token_versions"], r["loss_mask"]) if m} == {1} and r["episode_end"] == "scripted end"
        assert r["policy_version_start"] == 1 and r["status"] is None


def test_a_policy_that_restarts_episodes_refuses_an_agent():
    loop, *_ = make_loop("keep")
    flight = loop.flight
    flight.maker = EpisodeMaker(load_config(None, []), flight.engine.tokenizer, AgentEnvironment, True)
    with pytest.raises(ValueError, match="abort restarts episodes, which a black-box agent cannot do"):
        GenerationLoop(flight, FakeBuffer(1), POLICIES["abort"], max_inflight=1)


def test_admission_starts_groups_as_they_are_granted_and_hands_them_off_scored():
    loop, engine, buffer = make_loop("keep", groups=3, group_size=2)
    loop.max_inflight = 2
    loop.admit()
    assert buffer.asks == [(2, 0)]
    loop.admit()
    assert len(loop.flight) == 2 and loop.counters.groups_started == 2 and len(engine.requests) == 4
    finish(loop)
    for _ in range(10):
        loop.one_pass()
    assert loop.counters.groups_done == 3 and len(buffer.records) == 6 and loop.counters.tokens == 36
    assert all(r["reward"] == 0.0 and r["t_scored"] for r in buffer.records)


def test_a_bad_prompt_is_a_dropped_group_and_the_loop_goes_on():
    stream = iter([Prompt("empty", "", "0"), *[Prompt(f"p{i}", f"{i}+1=", "0") for i in range(3)]])
    loop, engine, buffer = make_loop("keep", groups=2, prompt_stream=stream)
    loop.admit()
    loop.admit()
    dropped = [r for r in buffer.records if r["prompt_id"] == "empty"]
    assert [(r["status"], r["status_reason"]) for r in dropped] == [("dropped_error", "empty prompt")] * 2
    assert loop.counters.bad_prompts == 1 and len(loop.flight) == 1


def test_stop_records_every_sample_in_flight_as_aborted_with_what_it_sampled():
    loop, engine, buffer = started("keep")
    records = loop.stop(0, "stopped")
    assert not loop.flight.groups and not engine.has_unfinished()
    assert [(r["status"], r["finish_reason"], r["response_ids"], r["token_versions"]) for r in records] == [
        ("aborted_at_end", "abort", [7, 7], [0, 0])] * 2


def test_the_loop_modules_import_no_ray():
    code = ("import sys, asyncrl.actors.rollout.loop, asyncrl.actors.rollout.offline, asyncrl.actors.rollout.scoring; "
            "print('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


class HeldBuffer(FakeBuffer):
    """An admission call the buffer holds (it never answers here); the loop's waits on it are recorded."""

    def __init__(self) -> None:
        super().__init__(0)
        self.waits: list[float] = []

    def ask(self, room: int, version: int) -> None:
        self.asks.append((room, version))
        self.answer = 0

    def granted(self, timeout_s: float = 0.0):
        return None

    def wait(self, timeout_s: float) -> None:
        self.waits.append(timeout_s)


def test_an_idle_loop_sleeps_on_its_admission_call_and_polls_only_while_it_holds_groups():
    from asyncrl.actors.rollout.loop import IDLE_WAIT_S, QUIET_WAIT_S

    loop, engine, buffer = make_loop("keep")
    held = HeldBuffer()
    loop.link = held
    loop.one_pass()  # nothing held, the call held by the buffer: a long wait, which an answer or a notify ends
    assert held.asks == [(1, 0)] and held.waits == [QUIET_WAIT_S] and loop.quiet()
    loop.flight.start_groups(1)  # a group generating: the engine steps, no wait
    loop.one_pass()
    assert held.waits == [QUIET_WAIT_S]
    while engine.has_unfinished():
        loop.one_pass()
    assert len(loop.flight.scoring) == 1 and not loop.quiet()  # being scored: its score must be taken soon
    loop.one_pass()
    assert held.waits[-1] == IDLE_WAIT_S
    deadline = time.monotonic() + 30
    while len(loop.flight.scoring) and time.monotonic() < deadline:  # scored on a thread: taken at a check
        time.sleep(0.01)
        loop.one_pass()
    assert loop.quiet() and len(buffer.records) == 2  # the scoring hands off through the put it was given


class AnsweringLink(HeldBuffer):
    """As BufferLink with `wake`: its wait sleeps on the loop's event, which an answer sets; `answers` says whether
    the call's answer comes back while the pass that asked goes on (before its wait)."""

    def __init__(self, wake, answers: bool) -> None:
        super().__init__()
        self.wake, self.answers, self.woken = wake, answers, []

    def ask(self, room: int, version: int) -> None:
        super().ask(room, version)
        if self.answers:
            self.wake.set()

    def wait(self, timeout_s: float) -> None:
        self.woken.append(self.wake.wait(timeout_s))


def test_what_wakes_the_loop_during_a_pass_ends_its_wait_and_the_next_pass_starts_unwoken():
    loop, _, _ = make_loop("keep")
    loop.link = AnsweringLink(loop.wake, answers=True)
    loop.one_pass()
    assert loop.link.woken == [True]  # not lost to the pass's own clearing: it came after
    loop.link = AnsweringLink(loop.wake, answers=False)
    loop.one_pass()  # nothing wakes it: the whole quiet wait
    assert loop.link.woken == [False]
    loop.notify()  # a weight update or a stop queued from another thread
    assert loop.wake.is_set()
