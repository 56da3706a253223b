"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al., 2024).

A sample's baseline is the mean reward of the *other* samples of its group:
A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_group). The policy
loss is GRPO's clipped, off-policy-corrected loss.
"""
from __future__ import annotations

from typing import Any

import torch

from asyncrl.algorithms.base import AdvantageInputs, group_relative_advantages
from asyncrl.algorithms.grpo import policy_loss  # noqa: F401  (same loss, same correction modes)


def compute_advantages(inputs: AdvantageInputs, cfg: Any) -> torch.Tensor:
    _, inverse = torch.unique(inputs.group_index, return_inverse=True)
    size = torch.bincount(inverse).to(inputs.rewards.dtype)[inverse]  # [B] group size of each sample
    centered = group_relative_advantages(inputs.rewards, inputs.group_index, std_normalize=False)
    return centered * size / (size - 1).clamp(min=1)
