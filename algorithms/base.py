"""The algorithm interface, its registry, and the math every algorithm shares.

An algorithm is any object (a module works) with two pure functions:

    compute_advantages(inputs: AdvantageInputs, cfg) -> Tensor [B] or [B, T], or Advantages
    policy_loss(inputs: LossInputs, cfg) -> LossOutput

An algorithm with a learned critic also sets ``critic = True``, returns
``Advantages(advantages, returns)`` (the returns are the value targets) and has

    value_loss(inputs: ValueLossInputs, cfg) -> LossOutput

The learner then trains a value model next to the policy and passes its
values in ``AdvantageInputs.values``. The learner knows no algorithm by name:
it looks one up with `get_algorithm` (a registered name, or a dotted path to a
user module) and calls these functions.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import torch


@dataclass
class AdvantageInputs:
    """One scored batch. Position t of every [B, T] tensor is response token t+1 of the learner's layout."""

    rewards: torch.Tensor  # [B] sequence rewards (minus the summed KL penalty when algorithm.kl_penalty=reward)
    group_index: torch.Tensor  # [B] int, equal within a group of samples of one prompt
    response_mask: torch.Tensor  # [B, T] 1.0 on response tokens
    token_rewards: torch.Tensor  # [B, T] the reward on each last response token, minus any per-token KL penalty
    values: torch.Tensor | None = None  # [B, T] critic values V(s_t) (algorithms with critic = True)


@dataclass
class Advantages:
    advantages: torch.Tensor  # [B] (one per sequence, broadcast over its tokens) or [B, T]
    returns: torch.Tensor | None = None  # [B, T] value targets; required when the algorithm has a critic


@dataclass
class ValueLossInputs:
    values: torch.Tensor  # [B, T] current critic, with grad
    old_values: torch.Tensor  # [B, T] critic at the start of this learner step (no grad)
    returns: torch.Tensor  # [B, T] targets from compute_advantages
    response_mask: torch.Tensor  # [B, T]


@dataclass
class LossInputs:
    """Per-token tensors of one micro-batch, all [B, T] (T = response tokens)."""

    logprobs: torch.Tensor  # current policy, with grad
    proximal_logprobs: torch.Tensor  # policy at the start of this learner step (no grad)
    behavior_logprobs: torch.Tensor  # the engine's, at sampling temperature
    advantages: torch.Tensor  # [B, T] (sequence advantages broadcast over tokens)
    response_mask: torch.Tensor  # 1.0 on response tokens, 0.0 on padding
    ref_logprobs: torch.Tensor | None = None  # frozen reference policy


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar: a mean over `weight` units (tokens or sequences) of this micro-batch
    metrics: dict[str, float] = field(default_factory=dict)
    weight: float = 1.0  # how many units `loss` averages; the learner re-weights micro-batches by it


class Algorithm(Protocol):
    def compute_advantages(self, inputs: AdvantageInputs, cfg: Any) -> torch.Tensor | Advantages: ...

    def policy_loss(self, inputs: LossInputs, cfg: Any) -> LossOutput: ...


_REGISTRY: dict[str, Algorithm] = {}


def register_algorithm(name: str, algorithm: Algorithm | ModuleType) -> None:
    """Register under `name`; a second registration of the same name is an error."""
    if name in _REGISTRY:
        raise ValueError(f"algorithm {name!r} is already registered")
    needed = ("compute_advantages", "policy_loss") + (("value_loss",) if has_critic(algorithm) else ())
    for fn in needed:
        if not callable(getattr(algorithm, fn, None)):
            raise TypeError(f"algorithm {name!r} lacks a callable {fn}()")
    _REGISTRY[name] = algorithm  # type: ignore[assignment]


def has_critic(algorithm: Any) -> bool:
    return bool(getattr(algorithm, "critic", False))


def as_advantages(out: torch.Tensor | Advantages, mask: torch.Tensor, critic: bool) -> Advantages:
    """compute_advantages' result as [B, T] advantages (and returns), checked against the batch."""
    adv = out if isinstance(out, Advantages) else Advantages(out)
    if adv.advantages.shape == mask.shape[:1]:
        adv = Advantages(adv.advantages[:, None].expand_as(mask), adv.returns)
    if adv.advantages.shape != mask.shape:
        raise ValueError(f"compute_advantages returned shape {tuple(adv.advantages.shape)}; expected [B] or {tuple(mask.shape)}")
    if critic and (adv.returns is None or adv.returns.shape != mask.shape):
        raise ValueError(f"an algorithm with a critic must return Advantages(advantages, returns) with returns of shape {tuple(mask.shape)}")
    return adv


def registered_algorithms() -> list[str]:
    return sorted(_REGISTRY)


def get_algorithm(name: str) -> Algorithm:
    """A registered algorithm, or a user module imported by dotted path."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if "." not in name:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(registered_algorithms())}")
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"cannot import algorithm module {name!r}: {exc}") from exc
    if name not in _REGISTRY:
        register_algorithm(name, module)
    return _REGISTRY[name]


# ---- shared math -------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, x, torch.full_like(x, -torch.inf)).max()


def masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, x, torch.full_like(x, torch.inf)).min()


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str) -> tuple[torch.Tensor, float]:
    """(loss, units): token_mean averages all response tokens; seq_mean averages per-sequence token means over the
    sequences with a token in `mask` (one masked out whole, e.g. truncated or rejected, is not a unit)."""
    if mode == "token_mean":
        tokens = mask.sum()
        return (per_token * mask).sum() / tokens.clamp(min=1.0), tokens.item()
    counts = mask.sum(-1)  # [B]
    per_seq = (per_token * mask).sum(-1) / counts.clamp(min=1.0)  # [B]
    units = (counts > 0).sum()
    return per_seq.sum() / units.clamp(min=1), float(units.item())


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Normalised ESS of importance weights over masked tokens: (sum w)^2 / (n sum w^2), in (0, 1]."""
    w = weights * mask
    return w.sum() ** 2 / (mask.sum() * (w**2).sum()).clamp(min=1e-12)


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimate of KL(pi || ref) on tokens sampled from pi: log pi - log ref."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k2: (log pi - log ref)^2 / 2."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 (Schulman): r - 1 - log r with r = ref / pi; unbiased and >= 0."""
    log_r = ref_logprobs - logprobs
    return torch.exp(log_r) - 1.0 - log_r


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}  # name -> per-token estimator


def kl_loss_term(inputs: LossInputs, cfg: Any) -> torch.Tensor | float:
    """Per-token KL-to-reference penalty for the loss (0 unless kl_coef > 0 and kl_penalty=loss)."""
    if inputs.ref_logprobs is None or cfg.kl_coef <= 0 or cfg.kl_penalty != "loss":
        return 0.0
    return cfg.kl_coef * KL_ESTIMATORS[cfg.kl_estimator](inputs.logprobs, inputs.ref_logprobs)


def token_level_rewards(
    rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """[B, T]: each sequence's reward on its last response token, minus kl_coef * kl on every response token."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(-1).values  # [B]
    out = torch.zeros_like(mask)
    rows = torch.arange(mask.shape[0], device=mask.device)
    out[rows[last >= 0], last[last >= 0]] = rewards[last >= 0].to(out.dtype)
    if kl is not None and kl_coef > 0:
        out = out - kl_coef * kl * mask
    return out


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each contiguous response span; (advantages, returns), [B, T].

    delta_t = r_t + gamma * V_{t+1} * m_{t+1} - V_t;  A_t = (delta_t + gamma * lam * A_{t+1}) * m_t.
    The step after a response's last token is terminal (value 0); returns = A + V.
    """
    B, T = mask.shape
    adv = torch.zeros_like(values)
    next_adv = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_value = torch.zeros_like(next_adv)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * m
        adv[:, t] = next_adv
        next_value = values[:, t] * m
    return adv, (adv + values) * mask


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (unbiased std); zero outside the mask."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = (((x - mean) * mask) ** 2).sum() / (n - 1).clamp(min=1.0)
    return (x - mean) / (var.sqrt() + eps) * mask


def group_relative_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, std_normalize: bool, eps: float = 1e-6
) -> torch.Tensor:
    """(r - mean of its group) [/ (std of its group + eps)]; rewards, group_index: [B]."""
    groups, inverse = torch.unique(group_index, return_inverse=True)
    zeros = rewards.new_zeros(len(groups))  # the rewards' device and dtype (a CUDA learner's, or float64 in tests)
    count = zeros.index_add(0, inverse, torch.ones_like(rewards))
    mean = zeros.index_add(0, inverse, rewards) / count
    centered = rewards - mean[inverse]
    if not std_normalize:
        return centered
    var = zeros.index_add(0, inverse, centered**2) / (count - 1).clamp(min=1)
    return centered / (var.sqrt()[inverse] + eps)
