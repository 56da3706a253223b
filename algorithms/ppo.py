"""PPO with a learned critic (Schulman et al., 2017; Ouyang et al., 2022).

The learner trains a value model next to the policy (``critic = True``).
Advantages are GAE(gamma, lambda) over each response, with the sequence
reward on its last token (and, with ``algorithm.kl_penalty=reward``, the
per-token KL penalty on every token), whitened over the batch. The policy loss
is GRPO's clipped, off-policy-corrected loss; the value loss is PPO's clipped
squared error against the GAE returns.
"""
from __future__ import annotations

from typing import Any

import torch

from asyncrl.algorithms.base import (
    AdvantageInputs,
    Advantages,
    LossOutput,
    ValueLossInputs,
    aggregate,
    gae,
    masked_mean,
    masked_whiten,
)
from asyncrl.algorithms.grpo import policy_loss  # noqa: F401  (same loss, same correction modes)

critic = True


def compute_advantages(inputs: AdvantageInputs, cfg: Any) -> Advantages:
    if inputs.values is None:
        raise ValueError("ppo needs critic values in AdvantageInputs.values")
    adv, returns = gae(inputs.token_rewards, inputs.values, inputs.response_mask, cfg.gamma, cfg.lam)
    return Advantages(masked_whiten(adv, inputs.response_mask), returns)


def value_loss(inputs: ValueLossInputs, cfg: Any) -> LossOutput:
    """0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clamp(V - V_old, +-value_clip)."""
    v, old, ret, mask = inputs.values, inputs.old_values, inputs.returns, inputs.response_mask
    clipped = old + (v - old).clamp(-cfg.value_clip, cfg.value_clip)
    per_token = 0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2)
    loss, units = aggregate(per_token, mask, cfg.loss_agg)
    with torch.no_grad():
        residual_var = masked_mean((ret - v - masked_mean(ret - v, mask)) ** 2, mask)
        return_var = masked_mean((ret - masked_mean(ret, mask)) ** 2, mask)
        metrics = {
            "critic/value_mean": masked_mean(v, mask).item(),
            "critic/return_mean": masked_mean(ret, mask).item(),
            "critic/clip_frac": masked_mean(((v - old).abs() > cfg.value_clip).float(), mask).item(),
            "critic/explained_variance": (1.0 - residual_var / return_var.clamp(min=1e-8)).item(),
        }
    return LossOutput(loss=loss, metrics=metrics, weight=units)
