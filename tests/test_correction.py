"""Rollout-correction presets, the mismatch metrics and reward shaping, against numbers derived by hand."""
import math

import pytest
import torch

from asyncrl.algorithms import LossInputs, get_algorithm
from asyncrl.algorithms.correction import mismatch_metrics, rollout_correction
from asyncrl.core.config import AlgorithmConfig, ConfigError, config_from_dict
from asyncrl.core.shaping import overlong_penalty, shaped_reward, zero_variance

grpo = get_algorithm("grpo")

# B=2, T=3; row 1 has two response tokens. rho = pi_prox / pi_behav per token:
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
RHO = [[2.0, 0.25, 1.0], [1.5, 1.2, 1.0]]
LOG_RHO = torch.log(torch.tensor(RHO)) * MASK
BEHAV = torch.full((2, 3), math.log(0.5)) * MASK
PROX = BEHAV + LOG_RHO
ADV = torch.tensor([[1.0] * 3, [-1.0] * 3])


def preset(name, cap=5.0, low=0.0, high=math.inf):
    out = rollout_correction(LOG_RHO, MASK, name, cap, low, high)
    return out.weight.tolist(), out.keep.tolist()


def approx(rows):
    return [pytest.approx(r, rel=1e-5) for r in rows]


def test_truncated_is_per_token_and_per_sequence():
    weight, keep = preset("token_tis", cap=1.8)
    assert weight == approx([[1.8, 0.25, 1.0], [1.5, 1.2, 0.0]]) and keep == MASK.tolist()
    weight, keep = preset("seq_tis", cap=5.0)  # products 2 * 0.25 * 1 = 0.5 and 1.5 * 1.2 = 1.8
    assert weight == approx([[0.5] * 3, [1.8, 1.8, 0.0]]) and keep == MASK.tolist()
    assert preset("seq_tis", cap=1.0)[0] == approx([[0.5] * 3, [1.0, 1.0, 0.0]])


def test_masked_is_drops_instead_of_truncating():
    weight, keep = preset("token_mis", low=0.5, high=2.0)  # 0.25 leaves the band; 2.0 is on its edge and stays
    assert keep == [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]] and weight == approx([[2.0, 0.25, 1.0], [1.5, 1.2, 0.0]])
    weight, keep = preset("seq_mis", low=0.6, high=2.0)  # row 0's product 0.5 < 0.6: the whole sequence goes
    assert keep == [[0.0] * 3, [1.0, 1.0, 0.0]] and weight == approx([[0.5] * 3, [1.8, 1.8, 0.0]])


def test_geometric_rejection_and_icepop():
    # geometric means: 0.5 ** (1/3) = 0.7937 and 1.8 ** (1/2) = 1.3416
    weight, keep = preset("geo_rs", low=0.7, high=1.0)
    assert keep == [[1.0] * 3, [0.0] * 3] and weight == MASK.tolist()
    assert preset("geo_rs", low=0.999, high=1.001)[1] == [[0.0] * 3, [0.0] * 3]
    weight, keep = preset("icepop", low=0.5, high=5.0)  # the 0.25 token weighs 0 but stays in the denominator
    assert weight == approx([[2.0, 0.0, 1.0], [1.5, 1.2, 0.0]]) and keep == MASK.tolist()


def loss(cfg: AlgorithmConfig):
    """pi = pi_prox (the clipped ratio is 1): per token -A * weight."""
    return grpo.policy_loss(LossInputs(PROX.clone(), PROX, BEHAV, ADV, MASK), cfg)


def test_the_loss_drops_rejected_tokens_from_its_mean():
    # token_mis: kept tokens -2, -1 (row 0, A=+1) and +1.5, +1.2 (row 1, A=-1): mean over 4 = -0.075
    out = loss(AlgorithmConfig(rollout_correction="token_mis"))
    assert out.loss.item() == pytest.approx(-0.3 / 4, rel=1e-5) and out.weight == 4
    assert out.metrics["loss/kept_frac"] == pytest.approx(4 / 5)
    # geo_rs with [0.7, 1.0]: only row 0 is kept, weight 1: three tokens of -1; seq_mean has one unit
    out = loss(AlgorithmConfig(rollout_correction="geo_rs", rc_low=0.7, rc_high=1.0))
    assert out.loss.item() == pytest.approx(-1.0) and out.weight == 3
    out = loss(AlgorithmConfig(rollout_correction="geo_rs", rc_low=0.7, rc_high=1.0, loss_agg="seq_mean"))
    assert out.loss.item() == pytest.approx(-1.0) and out.weight == 1
    # icepop: -2, 0, -1, +1.5, +1.2 over all 5 tokens
    out = loss(AlgorithmConfig(rollout_correction="icepop"))
    assert out.loss.item() == pytest.approx(-0.3 / 5, rel=1e-5) and out.weight == 5


def test_correction_none_keeps_the_presets_mask_but_not_its_weight():
    # the clipped ratio is pi / pi_behav = rho itself, clipped to [0.8, 1.2]: row 0 -> 1.2, 0.8 (pessimistic min
    # with A=+1 picks 0.25), 1.0; token_mis drops the 0.25 token
    out = loss(AlgorithmConfig(correction="none", rollout_correction="token_mis"))
    # row 0: -min(2, 1.2) = -1.2, -1.0; row 1 (A=-1): max(1.5, 1.2) = 1.5, max(1.2, 1.2) = 1.2
    assert out.loss.item() == pytest.approx((-1.2 - 1.0 + 1.5 + 1.2) / 4, rel=1e-5)


def test_mismatch_metrics_only_count_rows_the_learner_sampled():
    fresh = torch.tensor([True, False])
    m = mismatch_metrics(PROX, BEHAV, MASK, fresh, AlgorithmConfig(rollout_correction="token_mis"))
    # k3 with r = rho on row 0: (2 - 1 - ln 2) + (0.25 - 1 - ln 0.25) + 0, over 3 tokens
    k3 = ((1 - math.log(2)) + (-0.75 + math.log(4))) / 3
    assert m["mismatch/k3"] == pytest.approx(k3, rel=1e-5) and m["mismatch/ratio_max"] == pytest.approx(2.0)
    assert m["mismatch/frac_masked"] == pytest.approx(1 / 3) and m["mismatch/samples"] == 1
    assert mismatch_metrics(PROX, BEHAV, MASK, fresh, AlgorithmConfig())["mismatch/frac_masked"] == 0.0  # token_tis drops none
    assert mismatch_metrics(PROX, BEHAV, MASK, torch.tensor([False, False]), AlgorithmConfig()) == {"mismatch/samples": 0.0}


def test_overlong_penalty_by_hand():
    # max_new_tokens 20, buffer 4: free up to 16 tokens, then -1/4 per token to -1 at 20
    assert [overlong_penalty(n, 20, 4, 1.0) for n in (10, 16, 17, 19, 20)] == [0.0, 0.0, -0.25, -0.75, -1.0]
    assert overlong_penalty(20, 20, 4, 0.0) == 0.0 and overlong_penalty(18, 20, 4, 0.5) == -0.25
    algo = AlgorithmConfig(overlong_penalty=1.0, overlong_buffer=4)
    assert shaped_reward({"reward": 1.0, "response_ids": [0] * 18}, algo, 20) == 0.5
    assert zero_variance([1.0, 1.0]) and not zero_variance([1.0, 0.5])


def test_the_old_is_level_key_reads_as_a_preset():
    assert config_from_dict({"algorithm": {"is_level": "sequence"}}).algorithm.rollout_correction == "seq_tis"
    with pytest.raises(ConfigError, match="algorithm.is_level: replaced by algorithm.rollout_correction"):
        config_from_dict({"algorithm": {"is_level": "sequence", "rollout_correction": "icepop"}})
    with pytest.raises(ConfigError, match="algorithm.rc_low: must be below"):
        config_from_dict({"algorithm": {"rc_low": 2.0, "rc_high": 1.0}})
