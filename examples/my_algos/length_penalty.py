"""A user algorithm: Dr. GRPO advantages with a small penalty on long responses.

Run it with
    PYTHONPATH=examples python -m asyncrl.run --config configs/smoke.yaml algorithm.name=my_algos.length_penalty
"""
from __future__ import annotations

from typing import Any

import torch

from asyncrl.algorithms.base import AdvantageInputs, LossInputs, LossOutput, aggregate, group_relative_advantages


def compute_advantages(inputs: AdvantageInputs, cfg: Any) -> torch.Tensor:
    return group_relative_advantages(inputs.rewards, inputs.group_index, std_normalize=False)  # [B]


def policy_loss(inputs: LossInputs, cfg: Any) -> LossOutput:
    ratio = torch.exp(inputs.logprobs - inputs.proximal_logprobs)  # [B, T]
    clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    adv = inputs.advantages - 0.01 * inputs.response_mask.sum(-1, keepdim=True)  # shorter is better
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    loss, units = aggregate(per_token, inputs.response_mask, cfg.loss_agg)
    return LossOutput(loss=loss, metrics={"loss/ratio_mean": ratio.mean().item()}, weight=units)
