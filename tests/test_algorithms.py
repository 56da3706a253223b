"""Advantages, losses and the registry, against numbers derived by hand."""
import math
import sys
import textwrap
import types

from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import asyncrl.algorithms as algorithms
from asyncrl.algorithms import AdvantageInputs, LossInputs, get_algorithm, register_algorithm, registered_algorithms
from asyncrl.algorithms.base import (
    ValueLossInputs, as_advantages, gae, has_critic, group_relative_advantages, kl_k1, kl_k2, kl_k3, masked_mean, masked_whiten,
    token_level_rewards,
)
from asyncrl.core.config import AlgorithmConfig

grpo = get_algorithm("grpo")


def scored(rewards, groups) -> AdvantageInputs:
    """One response token per sample: enough for critic-free algorithms."""
    r = torch.tensor(rewards)
    mask = torch.ones(len(rewards), 1)
    return AdvantageInputs(r, torch.tensor(groups), mask, r[:, None].clone())


def one_token(logprob, proximal, behavior, advantage, ref=None):
    t = lambda v: torch.tensor([[float(v)]])  # noqa: E731  [B=1, T=1]
    return LossInputs(t(logprob), t(proximal), t(behavior), t(advantage), t(1.0), None if ref is None else t(ref))


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    # group 0: mean 0.5, unbiased std sqrt(0.5) = 0.7071 -> +-0.7071; group 1: all equal -> 0
    adv = group_relative_advantages(rewards, groups, std_normalize=True)
    assert adv.tolist() == pytest.approx([0.70710, -0.70710, 0.0, 0.0], abs=1e-4)
    # Dr. GRPO: no std division -> +-0.5
    adv = group_relative_advantages(rewards, groups, std_normalize=False)
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_ratio_e_clipped_to_1_2():
    cfg = AlgorithmConfig(correction="decoupled", clip_low=0.2, clip_high=0.2)
    # pi/pi_prox = e, behaviour = proximal (weight 1): positive advantage -> min(e, 1.2) = 1.2
    out = grpo.policy_loss(one_token(1.0, 0.0, 0.0, 1.0), cfg)
    assert out.loss.item() == pytest.approx(-1.2)
    assert out.metrics["loss/clip_frac_high"] == 1.0
    # negative advantage -> min(-e, -1.2) = -e: the pessimistic side is not clipped
    out = grpo.policy_loss(one_token(1.0, 0.0, 0.0, -1.0), cfg)
    assert out.loss.item() == pytest.approx(math.e)


def test_clip_higher_dapo():
    cfg = AlgorithmConfig(clip_low=0.2, clip_high=0.28)
    out = grpo.policy_loss(one_token(1.0, 0.0, 0.0, 1.0), cfg)
    assert out.loss.item() == pytest.approx(-1.28)


def test_decoupled_behavior_weight_and_cap():
    # pi = pi_prox (ratio 1), pi_prox / pi_behav = 2 -> loss = -A * 2
    lp = math.log(0.5)
    out = grpo.policy_loss(one_token(lp, lp, lp - math.log(2.0), 1.0), AlgorithmConfig(is_cap=5.0))
    assert out.loss.item() == pytest.approx(-2.0, rel=1e-5)
    assert out.metrics["is_ratio/mean"] == pytest.approx(2.0, rel=1e-5)
    # truncated at 1.5
    out = grpo.policy_loss(one_token(lp, lp, lp - math.log(2.0), 1.0), AlgorithmConfig(is_cap=1.5))
    assert out.loss.item() == pytest.approx(-1.5, rel=1e-5)
    assert out.metrics["is_ratio/truncated_frac"] == 1.0


def test_tis_and_none():
    # tis: clipped ratio on pi/pi_prox (=1) times min(pi/pi_behav, cap) = 3 -> -3
    lp = math.log(0.6)
    out = grpo.policy_loss(one_token(lp, lp, lp - math.log(3.0), 1.0), AlgorithmConfig(correction="tis", is_cap=5.0))
    assert out.loss.item() == pytest.approx(-3.0, rel=1e-5)
    # none: ratio pi/pi_behav = 3 clipped to 1.2 for a positive advantage
    out = grpo.policy_loss(one_token(lp, lp, lp - math.log(3.0), 1.0), AlgorithmConfig(correction="none"))
    assert out.loss.item() == pytest.approx(-1.2, rel=1e-5)


def test_gradient_flows_only_through_current_logprobs():
    x = torch.tensor([[0.1]], requires_grad=True)
    inputs = LossInputs(x, torch.tensor([[0.1]]), torch.tensor([[0.1]]), torch.tensor([[1.0]]), torch.tensor([[1.0]]))
    grpo.policy_loss(inputs, AlgorithmConfig()).loss.backward()
    # d/dx of -exp(x - 0.1) * 1 at x = 0.1 is -1
    assert x.grad.item() == pytest.approx(-1.0)


def test_masked_mean_ignores_padding():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)


def test_kl_estimators_by_hand():
    lp, ref = torch.tensor(0.0), torch.tensor(math.log(0.5))
    assert kl_k1(lp, ref).item() == pytest.approx(math.log(2))
    assert kl_k2(lp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    # r = ref/pi = 0.5 -> 0.5 - 1 - log 0.5 = 0.19315
    assert kl_k3(lp, ref).item() == pytest.approx(0.19315, abs=1e-5)
    assert kl_k3(lp, lp).item() == 0.0


def test_kl_penalty_in_loss():
    cfg = AlgorithmConfig(kl_coef=0.5)
    out = grpo.policy_loss(one_token(0.0, 0.0, 0.0, 0.0, ref=math.log(0.5)), cfg)
    assert out.loss.item() == pytest.approx(0.5 * 0.19315, abs=1e-5)


def test_registry_refuses_duplicates_and_lists_names():
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("grpo", grpo)
    with pytest.raises(ValueError, match="registered: .*grpo"):
        get_algorithm("nonexistent")
    with pytest.raises(TypeError, match="policy_loss"):
        register_algorithm("broken", types.SimpleNamespace(compute_advantages=lambda *a: None))
    with pytest.raises(TypeError, match="value_loss"):  # a critic needs a value loss
        register_algorithm("broken_critic", types.SimpleNamespace(critic=True, compute_advantages=len, policy_loss=len))
    assert {"grpo", "ppo", "rloo", "reinforce_pp"} <= set(registered_algorithms())


def test_user_plugin_by_dotted_path(tmp_path, monkeypatch):
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "my_algo.py").write_text(textwrap.dedent("""
        from asyncrl.algorithms.grpo import policy_loss
        def compute_advantages(inputs, cfg):
            return inputs.rewards - inputs.rewards.mean()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    algo = get_algorithm("my_pkg.my_algo")
    adv = algo.compute_advantages(scored([1.0, 0.0], [0, 0]), AlgorithmConfig())
    assert adv.tolist() == [0.5, -0.5]
    assert get_algorithm("my_pkg.my_algo") is algo
    sys.modules.pop("my_pkg.my_algo", None)


def test_rloo_leave_one_out_by_hand():
    rloo = get_algorithm("rloo")
    # group of 3 rewards [1, 0, 0]: baselines are mean of the others = [0, 0.5, 0.5]
    adv = rloo.compute_advantages(scored([1.0, 0.0, 0.0], [0, 0, 0]), AlgorithmConfig())
    assert adv.tolist() == pytest.approx([1.0, -0.5, -0.5])


def test_reinforce_pp_batch_whitening_by_hand():
    rpp = get_algorithm("reinforce_pp")
    # group-centred: [0.5, -0.5, 0, 0]; batch std (unbiased) = sqrt(0.5 / 3) = 0.40825
    adv = rpp.compute_advantages(scored([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1]), AlgorithmConfig())
    assert adv.tolist() == pytest.approx([1.22474, -1.22474, 0.0, 0.0], abs=1e-4)


def test_loss_aggregation_by_hand():
    from asyncrl.algorithms.base import aggregate

    per_token = torch.tensor([[1.0, 3.0, 0.0], [6.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, units = aggregate(per_token, mask, "token_mean")
    assert loss.item() == pytest.approx(10 / 3) and units == 3  # (1 + 3 + 6) / 3 tokens
    loss, units = aggregate(per_token, mask, "seq_mean")
    assert loss.item() == pytest.approx(4.0) and units == 2  # mean of (2, 6)


def test_effective_sample_size_by_hand():
    from asyncrl.algorithms.base import effective_sample_size

    mask = torch.ones(1, 4)
    assert effective_sample_size(torch.ones(1, 4), mask).item() == pytest.approx(1.0)
    # weights (2, 0, 0, 0): (2)^2 / (4 * 4) = 0.25, one effective sample out of four
    assert effective_sample_size(torch.tensor([[2.0, 0.0, 0.0, 0.0]]), mask).item() == pytest.approx(0.25)


def test_sequence_level_is_weight_by_hand():
    # two tokens, each with pi_prox / pi_behav = 1.5: token level weights 1.5 each, sequence level 2.25 each
    lp = math.log(0.5)
    t = lambda *v: torch.tensor([list(v)])  # noqa: E731  [B=1, T=2]
    inputs = LossInputs(t(lp, lp), t(lp, lp), t(lp - math.log(1.5), lp - math.log(1.5)), t(1.0, 1.0), t(1.0, 1.0))
    token = grpo.policy_loss(inputs, AlgorithmConfig(rollout_correction="token_tis"))
    seq = grpo.policy_loss(inputs, AlgorithmConfig(rollout_correction="seq_tis"))
    assert token.loss.item() == pytest.approx(-1.5, rel=1e-5)
    assert seq.loss.item() == pytest.approx(-2.25, rel=1e-5)
    # and the cap truncates the sequence weight: min(2.25, 2.0)
    assert grpo.policy_loss(inputs, AlgorithmConfig(rollout_correction="seq_tis", is_cap=2.0)).loss.item() == pytest.approx(-2.0, rel=1e-5)


# ---- PPO with a critic ---------------------------------------------------------

# one sample in the learner's layout: two prompt positions, then a 2-token response, then padding
MASK = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]])


def test_token_level_rewards_put_the_reward_on_the_last_response_token():
    assert token_level_rewards(torch.tensor([3.0]), MASK).tolist() == [[0.0, 0.0, 0.0, 3.0, 0.0]]
    kl = torch.tensor([[9.0, 9.0, 0.5, 1.0, 9.0]])  # only response tokens are penalised
    assert token_level_rewards(torch.tensor([3.0]), MASK, kl, 0.1).tolist()[0] == pytest.approx([0, 0, -0.05, 2.9, 0])


def test_gae_by_hand():
    values = torch.tensor([[7.0, 7.0, 0.5, 0.8, 7.0]])  # values outside the response must not leak in
    rewards = token_level_rewards(torch.tensor([1.0]), MASK)
    adv, ret = gae(rewards, values, MASK, gamma=1.0, lam=0.5)
    # last token: delta = 1 - 0.8 = 0.2 (terminal after it), A = 0.2
    # first token: delta = 0 + 0.8 - 0.5 = 0.3, A = 0.3 + 1 * 0.5 * 0.2 = 0.4; returns = A + V
    assert adv.tolist()[0] == pytest.approx([0, 0, 0.4, 0.2, 0])
    assert ret.tolist()[0] == pytest.approx([0, 0, 0.9, 1.0, 0])
    # gamma = 0.5, lam = 1: A_last = 0.2, A_first = (0 + 0.5 * 0.8 - 0.5) + 0.5 * 0.2 = 0.0
    adv, _ = gae(rewards, values, MASK, gamma=0.5, lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0, 0, 0.0, 0.2, 0])


def test_masked_whiten_by_hand():
    x = torch.tensor([[100.0, 1.0, 3.0, 100.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    # mean 2, unbiased std sqrt(2) -> (+-1 / 1.41421)
    assert masked_whiten(x, mask).tolist()[0] == pytest.approx([0, -0.70711, 0.70711, 0], abs=1e-5)


def test_ppo_advantages_are_whitened_gae_with_returns():
    ppo = get_algorithm("ppo")
    mask = MASK.repeat(2, 1)
    values = torch.tensor([[0, 0, 0.5, 0.8, 0], [0, 0, 0.5, 0.8, 0]])
    rewards = torch.tensor([1.0, 0.0])
    inputs = AdvantageInputs(rewards, torch.tensor([0, 0]), mask, token_level_rewards(rewards, mask), values)
    out = ppo.compute_advantages(inputs, AlgorithmConfig(gamma=1.0, lam=0.5))
    # raw GAE: sample 0 [0.4, 0.2] (above); sample 1: last -0.8, first 0.3 + 0.5 * -0.8 = -0.1
    raw = torch.tensor([[0, 0, 0.4, 0.2, 0], [0, 0, -0.1, -0.8, 0]])
    torch.testing.assert_close(out.advantages, masked_whiten(raw, mask))
    torch.testing.assert_close(out.returns, torch.tensor([[0, 0, 0.9, 1.0, 0], [0, 0, 0.4, 0.0, 0]]))
    with pytest.raises(ValueError, match="critic values"):
        ppo.compute_advantages(AdvantageInputs(rewards, torch.tensor([0, 0]), mask, mask), AlgorithmConfig())


def test_value_loss_clipped_by_hand():
    ppo = get_algorithm("ppo")
    t = lambda v: torch.tensor([[float(v)]])  # noqa: E731
    # old 0, new 0.5, return 1, clip 0.2: unclipped (0.5 - 1)^2 = 0.25, clipped (0.2 - 1)^2 = 0.64 -> 0.5 * 0.64
    out = ppo.value_loss(ValueLossInputs(t(0.5), t(0.0), t(1.0), t(1.0)), AlgorithmConfig(value_clip=0.2))
    assert out.loss.item() == pytest.approx(0.32)
    assert out.metrics["critic/clip_frac"] == 1.0
    # inside the clip range the plain squared error applies: 0.5 * (0.1 - 1)^2
    out = ppo.value_loss(ValueLossInputs(t(0.1), t(0.0), t(1.0), t(1.0)), AlgorithmConfig(value_clip=0.2))
    assert out.loss.item() == pytest.approx(0.405)


def test_as_advantages_broadcasts_and_checks_shapes():
    mask = torch.ones(2, 3)
    assert as_advantages(torch.tensor([1.0, -1.0]), mask, critic=False).advantages.tolist() == [[1, 1, 1], [-1, -1, -1]]
    with pytest.raises(ValueError, match="shape"):
        as_advantages(torch.ones(3), mask, critic=False)
    with pytest.raises(ValueError, match="returns"):
        as_advantages(torch.ones(2, 3), mask, critic=True)


def test_kl_penalty_in_reward_leaves_the_loss_alone():
    cfg = AlgorithmConfig(kl_coef=0.5, kl_penalty="reward")
    out = grpo.policy_loss(one_token(0.0, 0.0, 0.0, 0.0, ref=math.log(0.5)), cfg)
    assert out.loss.item() == 0.0


# ---- device- and dtype-generic math: the next `torch.zeros(n)` without device= fails here, not on a GPU ----

BUILT_IN = sorted(p.stem for p in Path(algorithms.__file__).parent.glob("*.py") if p.stem not in ("__init__", "base", "correction"))
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.as_tensor, torch.arange, torch.rand,
             torch.randn, torch.randint, torch.eye, torch.linspace}


class DeviceFromInputs(TorchFunctionMode):
    """Records every tensor factory called without `device=`: it would put a tensor on the CPU next to a CUDA
    learner's. (The meta device cannot run these functions: torch.unique and .item() have no meta kernels.)"""

    def __init__(self) -> None:
        super().__init__()
        self.offenders: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs:
            self.offenders.append(func.__name__)
        return func(*args, **kwargs)


def float64_batch() -> tuple[AdvantageInputs, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    B, T = 6, 5
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[0, 3:] = 0
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0], dtype=torch.float64)
    token_rewards = torch.zeros(B, T, dtype=torch.float64)
    token_rewards[:, -1] = rewards
    values = torch.rand(B, T, generator=g, dtype=torch.float64)
    return AdvantageInputs(rewards, torch.tensor([7, 7, 7, 9, 9, 9]), mask, token_rewards, values), mask


@pytest.mark.parametrize("name", BUILT_IN)
@pytest.mark.parametrize("correction, level", [("decoupled", "token_tis"), ("decoupled", "seq_tis"), ("tis", "token_tis"), ("none", "token_tis"),
                                               ("decoupled", "geo_rs"), ("decoupled", "icepop"), ("none", "seq_mis")])
def test_every_builtin_keeps_its_inputs_device_and_dtype(name, correction, level):
    assert name in registered_algorithms()
    algo = get_algorithm(name)
    cfg = AlgorithmConfig(name=name, correction=correction, rollout_correction=level, kl_coef=0.1)
    inputs, mask = float64_batch()
    g = torch.Generator().manual_seed(1)
    logprobs, proximal, behavior, ref, v = (torch.rand(mask.shape, generator=g, dtype=torch.float64) for _ in range(5))
    logprobs = (-logprobs).requires_grad_()
    v.requires_grad_()
    guard = DeviceFromInputs()
    with guard:
        adv = as_advantages(algo.compute_advantages(inputs, cfg), mask, has_critic(algo))
        per_token = adv.advantages if adv.advantages.dim() == 2 else adv.advantages[:, None].expand_as(mask)
        out = algo.policy_loss(LossInputs(logprobs, -proximal, -behavior, per_token, mask, -ref), cfg)
        out.loss.backward()
        if has_critic(algo):
            vout = algo.value_loss(ValueLossInputs(v, inputs.values, adv.returns, mask), cfg)
            assert vout.loss.dtype == torch.float64
    assert guard.offenders == [], f"{name}: tensor factories without device=: {guard.offenders}"
    assert adv.advantages.dtype == torch.float64 and out.loss.dtype == torch.float64 and logprobs.grad.dtype == torch.float64
    assert torch.isfinite(out.loss) and all(math.isfinite(v) for v in out.metrics.values())


def test_the_device_guard_catches_a_bare_factory():
    guard = DeviceFromInputs()
    with guard:
        torch.zeros(3)
        torch.zeros(3, device="cpu")
    assert guard.offenders == ["zeros"]
