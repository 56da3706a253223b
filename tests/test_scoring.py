"""Scoring in a child process (asyncrl.core.scoring): the cache, the traits, and hard timeouts that leave nothing running."""
from __future__ import annotations

import os
import time

import pytest

from asyncrl.core.reward_traits import RewardTraits, per_sample, reward, traits_of
from asyncrl.core.scoring import RewardCache, ScoringProcess, cache_key, percentile
from asyncrl.core.prompts import Prompt
from asyncrl.core.rewards import exact_match

P = Prompt("p0", "1+1=", "2")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"


def test_the_cache_key_names_the_reward_its_version_the_prompt_and_the_response():
    base = cache_key("r", "1", P, "2")
    assert base == cache_key("r", "1", Prompt("other id", "1+1=", "2"), "2")  # the id is not the prompt
    others = [cache_key("s", "1", P, "2"), cache_key("r", "2", P, "2"), cache_key("r", "1", Prompt("p0", "1+2=", "2"), "2"),
              cache_key("r", "1", Prompt("p0", "1+1=", "3"), "2"), cache_key("r", "1", P, "3"), cache_key("r1", "", P, "2")]
    assert len({base, *others}) == 7


def test_the_cache_counts_hits_and_evicts_the_least_recently_used():
    cache = RewardCache(2)
    cache.put("a", 1.0)
    cache.put("b", 0.0)  # 0.0 is a result, not a miss
    assert cache.get("a") == 1.0 and cache.get("b") == 0.0
    cache.get("a")  # a is now the most recent
    cache.put("c", 2.0)
    assert cache.get("b") is None and cache.get("a") == 1.0 and cache.get("c") == 2.0
    assert (cache.hits, cache.misses) == (5, 1)


def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0 and percentile(values, 1.0) == 100.0
    assert percentile([3.0], 0.99) == 3.0


def test_traits_come_from_the_decorator_and_default_to_per_sample_deterministic():
    @reward(batched=True, deterministic=False, version=3)
    def batched(prompts, responses):
        return [1.0] * len(prompts)

    assert traits_of(batched) == RewardTraits(batched=True, deterministic=False, version="3")
    assert traits_of(exact_match) == RewardTraits()
    assert per_sample(exact_match) is exact_match
    assert per_sample(batched)(P, "2") == 1.0


def scorer(name: str, timeout_s: float = 5.0) -> ScoringProcess:
    return ScoringProcess(f"tests.reward_fns.{name}", {}, timeout_s)


def test_a_per_sample_reward_scores_in_its_child_in_order():
    proc = scorer("length")
    try:
        out = proc.score([P] * 3, ["a", "bb", ""])
        assert [s.value for s in out] == [1.0, 2.0, 0.0] and all(s.error is None for s in out)
        pid = proc.pid
        assert pid is not None and pid != os.getpid()
        assert [s.value for s in proc.score([P], ["ccc"])] == [3.0] and proc.pid == pid  # the same child serves the next call
    finally:
        proc.close()
    assert not alive(pid)


def test_a_hung_sample_is_killed_at_its_timeout_and_the_rest_are_scored_in_a_fresh_child():
    proc = scorer("hang_on_x", timeout_s=1.0)
    try:
        proc.score([P], ["warm"])  # the child is up (imports done) before the timed call
        first = proc.pid
        t0 = time.monotonic()
        out = proc.score([P] * 4, ["a", "x", "ccc", "dd"])
        took = time.monotonic() - t0
        assert [s.value for s in out] == [1.0, None, 3.0, 2.0]
        assert out[1].error == "reward timed out after 1 s (its process was killed)"
        assert 1.0 <= took < 30.0 and proc.timeouts == 1 and proc.restarts == 1
        assert not alive(first) and proc.pid != first
    finally:
        proc.close()


def test_a_reward_that_kills_its_process_fails_only_its_sample():
    proc = scorer("die_on_x")
    try:
        out = proc.score([P] * 3, ["a", "x", "bb"])
        assert [s.value for s in out] == [1.0, None, 2.0]
        assert out[1].error == "reward process died (exit code 7)" and proc.crashes == 1
    finally:
        proc.close()


def test_a_raising_reward_keeps_its_child():
    proc = scorer("raise_on_x")
    try:
        out = proc.score([P] * 2, ["x", "bb"])
        assert out[0].error == "reward raised ValueError('no x')" and out[1].value == 2.0 and proc.restarts == 0
    finally:
        proc.close()


def test_what_a_hung_reward_started_dies_with_it(tmp_path):
    proc = scorer("spawn_and_hang", timeout_s=2.0)
    pidfile = tmp_path / "grandchild"
    try:
        proc.score([P], ["warm"])
        out = proc.score([P], [str(pidfile)])
        assert out[0].error.startswith("reward timed out")
    finally:
        proc.close()
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)  # killed with the child's process group, not left behind


def test_a_batched_reward_gets_the_whole_batch_in_one_call_and_its_timeout_covers_the_call():
    proc = scorer("batch_sizes")
    try:
        assert [s.value for s in proc.score([P] * 5, ["a"] * 5)] == [5.0] * 5
    finally:
        proc.close()
    bad = scorer("wrong_count")
    try:
        out = bad.score([P] * 3, ["a"] * 3)
        assert {s.error for s in out} == {"reward raised ValueError('batched reward returned 1 values for 3 samples')"}
    finally:
        bad.close()


def test_a_reward_its_child_cannot_build_fails_its_samples_with_the_reason():
    proc = ScoringProcess("reward_model", {"model_path": "/nonexistent", "device": "cpu"}, 5.0)
    try:
        out = proc.score([P] * 2, ["a", "b"])
        assert out[0].error == out[1].error and out[0].error.startswith("reward 'reward_model' could not be built: ")
        assert proc.pid is None
    finally:
        proc.close()


@pytest.mark.parametrize("name", ["nope.fn", "tests.reward_fns.missing"])
def test_an_unknown_reward_is_an_error_before_a_child_starts(name):
    with pytest.raises(ValueError, match="cannot import module|has no attribute"):
        ScoringProcess(name, {}, 1.0)
