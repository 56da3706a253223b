"""REINFORCE++ (Hu, 2025): no critic, no per-group std; advantages whitened over the batch.

The "baseline" variant used for grouped sampling: subtract the group mean
reward, then divide by the standard deviation over the whole batch, which is
more stable than GRPO's per-group std when a group is nearly uniform. The
policy loss is GRPO's clipped, off-policy-corrected loss.
"""
from __future__ import annotations

from typing import Any

import torch

from asyncrl.algorithms.base import AdvantageInputs, group_relative_advantages
from asyncrl.algorithms.grpo import policy_loss  # noqa: F401  (same loss, same correction modes)


def compute_advantages(inputs: AdvantageInputs, cfg: Any, eps: float = 1e-6) -> torch.Tensor:
    centered = group_relative_advantages(inputs.rewards, inputs.group_index, std_normalize=False)  # [B]
    return centered / (centered.std() + eps) if centered.numel() > 1 else centered
