"""GRPO: group-relative advantages and a clipped policy loss with off-policy correction.

Correction modes (`algorithm.correction`):
- ``decoupled`` (AReaL): clip pi_theta / pi_prox, and weight each token by the
  behaviour importance weight pi_prox / pi_behav truncated at `is_cap`.
- ``tis``: truncated importance sampling, the clipped loss on pi_theta / pi_prox
  weighted by min(pi_theta / pi_behav, is_cap) without gradient through the weight.
- ``none``: plain PPO clipping on pi_theta / pi_behav.
"""
from __future__ import annotations

from typing import Any

import torch

from algorithms.base import (
    AdvantageInputs,
    LossInputs,
    LossOutput,
    aggregate,
    effective_sample_size,
    group_relative_advantages,
    kl_loss_term,
    masked_max,
    masked_mean,
    masked_min,
)


def compute_advantages(inputs: AdvantageInputs, cfg: Any) -> torch.Tensor:
    return group_relative_advantages(inputs.rewards, inputs.group_index, std_normalize=cfg.std_normalize)  # [B]


def behavior_weight(inputs: LossInputs, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(ratio that is clipped, truncated IS weight) per token, by correction mode."""
    if cfg.correction == "none":
        ratio = torch.exp(inputs.logprobs - inputs.behavior_logprobs)
        return ratio, torch.ones_like(ratio)
    ratio = torch.exp(inputs.logprobs - inputs.proximal_logprobs)
    anchor = inputs.proximal_logprobs if cfg.correction == "decoupled" else inputs.logprobs.detach()
    log_w = (anchor - inputs.behavior_logprobs) * inputs.response_mask  # [B, T]
    if cfg.is_level == "sequence":  # one weight per sequence: the product of its token ratios
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    return ratio, torch.exp(log_w).clamp(max=cfg.is_cap)


def policy_loss(inputs: LossInputs, cfg: Any) -> LossOutput:
    mask = inputs.response_mask  # [B, T]
    ratio, weight = behavior_weight(inputs, cfg)  # [B, T]
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    adv = inputs.advantages  # [B, T]
    per_token = -torch.minimum(ratio * adv, clipped * adv) * weight + kl_loss_term(inputs, cfg)
    loss, units = aggregate(per_token, mask, cfg.loss_agg)
    return LossOutput(loss=loss, metrics=_metrics(inputs, ratio, weight, cfg), weight=units)


@torch.no_grad()
def _metrics(inputs: LossInputs, ratio: torch.Tensor, weight: torch.Tensor, cfg: Any) -> dict[str, float]:
    mask = inputs.response_mask
    behav_ratio = torch.exp(inputs.proximal_logprobs - inputs.behavior_logprobs)
    return {
        "is_ratio/mean": masked_mean(behav_ratio, mask).item(),
        "is_ratio/max": masked_max(behav_ratio, mask).item(),
        "is_ratio/min": masked_min(behav_ratio, mask).item(),
        "is_ratio/truncated_frac": masked_mean((behav_ratio > cfg.is_cap).float(), mask).item(),
        "is_ratio/ess": effective_sample_size(behav_ratio, mask).item(),
        "loss/clip_frac_low": masked_mean((ratio < 1.0 - cfg.clip_low).float(), mask).item(),
        "loss/clip_frac_high": masked_mean((ratio > 1.0 + cfg.clip_high).float(), mask).item(),
        "loss/is_weight_mean": masked_mean(weight, mask).item(),
    }
