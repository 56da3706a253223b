"""The algorithm interface, its registry, and the math every algorithm shares.

An algorithm is any object (a module works) with two pure functions:

    compute_advantages(rewards [B], group_index [B], cfg) -> advantages [B]
    policy_loss(inputs: LossInputs, cfg) -> LossOutput

The learner knows no algorithm by name: it looks one up with `get_algorithm`
(a registered name, or a dotted path to a user module) and calls these two.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import torch


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
    def compute_advantages(self, rewards: torch.Tensor, group_index: torch.Tensor, cfg: Any) -> torch.Tensor: ...

    def policy_loss(self, inputs: LossInputs, cfg: Any) -> LossOutput: ...


_REGISTRY: dict[str, Algorithm] = {}


def register_algorithm(name: str, algorithm: Algorithm | ModuleType) -> None:
    """Register under `name`; a second registration of the same name is an error."""
    if name in _REGISTRY:
        raise ValueError(f"algorithm {name!r} is already registered")
    for fn in ("compute_advantages", "policy_loss"):
        if not callable(getattr(algorithm, fn, None)):
            raise TypeError(f"algorithm {name!r} lacks a callable {fn}()")
    _REGISTRY[name] = algorithm  # type: ignore[assignment]


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
    """(loss, units): token_mean averages all response tokens; seq_mean averages per-sequence token means."""
    if mode == "token_mean":
        tokens = mask.sum()
        return (per_token * mask).sum() / tokens.clamp(min=1.0), tokens.item()
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # [B]
    return per_seq.mean(), float(per_seq.numel())


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


def group_relative_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, std_normalize: bool, eps: float = 1e-6
) -> torch.Tensor:
    """(r - mean of its group) [/ (std of its group + eps)]; rewards, group_index: [B]."""
    groups, inverse = torch.unique(group_index, return_inverse=True)
    count = torch.zeros(len(groups), dtype=rewards.dtype).index_add_(0, inverse, torch.ones_like(rewards))
    mean = torch.zeros(len(groups), dtype=rewards.dtype).index_add_(0, inverse, rewards) / count
    centered = rewards - mean[inverse]
    if not std_normalize:
        return centered
    var = torch.zeros(len(groups), dtype=rewards.dtype).index_add_(0, inverse, centered**2) / (count - 1).clamp(min=1)
    return centered / (var.sqrt()[inverse] + eps)
