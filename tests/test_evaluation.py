"""Validation during training, the pure part: pass@k, sharing the held-out problems, the eval/ metrics, the config rules."""
from __future__ import annotations

import math
from itertools import combinations

import pytest

from asyncrl.core.config import ConfigError, load_config
from asyncrl.core.evaluation import EvalScores, eval_metrics, merge, pass_at_k, split_evenly


def brute_force_pass_at_k(correct: list[bool], k: int) -> float:
    """The share of k-subsets of the samples that hold a correct one (what the estimator computes in closed form)."""
    subsets = list(combinations(correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == 0.25  # pass@1 is the share of correct samples
    assert pass_at_k(4, 1, 2) == 0.5  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(3, 1, 3) == 1.0  # n - c < k: every k-subset holds the correct one
    assert pass_at_k(2, 0, 2) == 0.0 and pass_at_k(2, 1, 2) == 1.0  # k = n: solved by any of the samples


@pytest.mark.parametrize("n,c,k", [(6, 2, 3), (8, 3, 2), (7, 1, 4), (5, 0, 5)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k([True] * c + [False] * (n - c), k))


@pytest.mark.parametrize("n,c,k,word", [(4, 1, 0, "k="), (4, 1, 5, "k="), (4, 5, 2, "c="), (4, -1, 2, "c=")])
def test_pass_at_k_refuses_impossible_counts(n, c, k, word):
    with pytest.raises(ValueError, match=word):
        pass_at_k(n, c, k)


def test_split_evenly_keeps_order_and_sizes_within_one():
    assert split_evenly(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_evenly([1, 2], 4) == [[1], [2], [], []]
    assert [x for share in split_evenly(list(range(50)), 4) for x in share] == list(range(50))


def scores(greedy, tokens, cut, solved, samples) -> EvalScores:
    return EvalScores(greedy=greedy, greedy_tokens=tokens, greedy_truncated=cut, solved=solved, samples=samples)


def test_eval_metrics_of_merged_shares():
    a = scores([1.0, 0.0], [3, 6], [False, True], [2, 0], 2)
    b = scores([1.0], [3], [False], [1], 2)
    m = eval_metrics(merge([a, b]))
    assert m["eval/accuracy"] == pytest.approx(2 / 3)
    assert m["eval/response_len_mean"] == 4.0
    assert m["eval/truncated_frac"] == pytest.approx(1 / 3)
    assert m["eval/problems"] == 3
    assert m["eval/pass_at_1"] == pytest.approx((1.0 + 0.0 + 0.5) / 3)  # solved share per problem: 2/2, 0/2, 1/2
    assert m["eval/pass_at_k"] == pytest.approx(2 / 3)  # k = 2 = n: solved by any sample


def test_eval_metrics_without_samples_has_no_pass_at_k():
    m = eval_metrics(scores([0.5], [2], [False], [0], 0))
    assert "eval/pass_at_k" not in m and "eval/pass_at_1" not in m and m["eval/accuracy"] == 0.5
    with pytest.raises(ValueError, match="different numbers"):
        merge([scores([1.0], [1], [False], [1], 2), scores([1.0], [1], [False], [1], 3)])
    with pytest.raises(ValueError, match="no held-out"):
        eval_metrics(merge([]))
    assert not math.isnan(eval_metrics(scores([0.0], [0], [False], [0], 0))["eval/accuracy"])


def test_eval_every_rules_name_the_key():
    assert load_config("configs/smoke.yaml", ["run.eval_every=1", "run.eval_pass_k=4"]).run.eval_pass_k == 4
    with pytest.raises(ConfigError, match=r"^run\.eval_every: must be a multiple of learner\.sync_every \(2\)"):
        load_config("configs/smoke.yaml", ["run.eval_every=3", "learner.sync_every=2"])
    with pytest.raises(ConfigError, match=r"^run\.eval_pass_k: .*run\.eval_every > 0"):
        load_config("configs/smoke.yaml", ["run.eval_pass_k=4"])
    with pytest.raises(ConfigError, match=r"^run\.eval_every: .*single-turn"):
        load_config("configs/smoke.yaml", ["run.eval_every=1", "env.name=calculator", "env.max_episode_tokens=40"])
    with pytest.raises(ConfigError, match=r"^run\.eval_every: "):
        load_config("configs/smoke.yaml", ["run.eval_every=-1"])
