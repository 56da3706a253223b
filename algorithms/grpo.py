"""GRPO: group-relative advantages and a clipped policy loss with off-policy correction.

Correction modes (`algorithm.correction`) say which ratio is clipped and which
policy anchors the behaviour ratio rho = pi_anchor / pi_behav:
- ``decoupled`` (AReaL): clip pi_theta / pi_prox; rho = pi_prox / pi_behav.
- ``tis``: clip pi_theta / pi_prox; rho = pi_theta / pi_behav without gradient.
- ``none``: plain PPO clipping on pi_theta / pi_behav (rho only feeds a preset's mask).
`algorithm.rollout_correction` turns rho into each token's weight and keep mask
(algorithms/correction.py: token/sequence TIS, masked IS, geometric rejection,
icepop); dropped tokens leave the loss and its denominator.
"""
from __future__ import annotations

from typing import Any

import torch

from asyncrl.algorithms.base import (
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
from asyncrl.algorithms.correction import Correction, correct


def compute_advantages(inputs: AdvantageInputs, cfg: Any) -> torch.Tensor:
    return group_relative_advantages(inputs.rewards, inputs.group_index, std_normalize=cfg.std_normalize)  # [B]


def behavior_weight(inputs: LossInputs, cfg: Any) -> tuple[torch.Tensor, Correction]:
    """(ratio that is clipped [B, T], the preset's weight and keep mask), by correction mode."""
    mask = inputs.response_mask
    if cfg.correction == "none":
        ratio = torch.exp(inputs.logprobs - inputs.behavior_logprobs)
        corr = correct(inputs.proximal_logprobs, inputs.behavior_logprobs, mask, cfg)
        return ratio, Correction(mask.clone(), corr.keep)
    ratio = torch.exp(inputs.logprobs - inputs.proximal_logprobs)
    anchor = inputs.proximal_logprobs if cfg.correction == "decoupled" else inputs.logprobs.detach()
    return ratio, correct(anchor, inputs.behavior_logprobs, mask, cfg)


def policy_loss(inputs: LossInputs, cfg: Any) -> LossOutput:
    ratio, corr = behavior_weight(inputs, cfg)  # [B, T]
    mask = inputs.response_mask * corr.keep  # tokens a preset drops leave the loss and its denominator
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    adv = inputs.advantages  # [B, T]
    per_token = -torch.minimum(ratio * adv, clipped * adv) * corr.weight + kl_loss_term(inputs, cfg)
    loss, units = aggregate(per_token, mask, cfg.loss_agg)
    return LossOutput(loss=loss, metrics=_metrics(inputs, ratio, corr, cfg), weight=units)


@torch.no_grad()
def _metrics(inputs: LossInputs, ratio: torch.Tensor, corr: Correction, cfg: Any) -> dict[str, float]:
    mask, weight = inputs.response_mask, corr.weight
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
        "loss/kept_frac": masked_mean(corr.keep, mask).item(),
    }
