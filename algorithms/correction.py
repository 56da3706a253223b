"""Rollout-correction presets and train/inference mismatch metrics, as pure functions.

Every preset turns the behaviour ratio of each response token,

    rho_t = pi_anchor(y_t) / pi_behav(y_t)

(pi_anchor: the proximal policy for ``algorithm.correction=decoupled``, the current policy without gradient for
``tis``), into a per-token importance weight and a keep mask (`Correction`). A kept token stays in the loss and
in its denominator; a token that is not kept is gone from both, as if it were padding (verl's rejection
sampling). With ``correction=none`` the clipped ratio is already pi / pi_behav: a preset's mask still applies,
its weight is 1.

| preset | weight | keep | from |
| --- | --- | --- | --- |
| none | 1 | every token | |
| token_tis | min(rho_t, is_cap) | every token | TIS (Yao et al.), verl, slime |
| seq_tis | min(prod_t rho_t, is_cap) on every token | every token | verl decoupled_seq_is |
| token_mis | rho_t | low <= rho_t <= high | verl rollout_rs=token (MIS) |
| seq_mis | prod_t rho_t | the whole sequence iff low <= prod rho <= high | verl decoupled_seq_is_rs |
| geo_rs | 1 | the whole sequence iff low <= exp(mean_t log rho_t) <= high | verl decoupled_geo_rs |
| icepop | rho_t if low <= rho_t <= high, else 0 | every token (a zeroed one still counts in the mean) | IcePop (Ring-1T), slime |

Sequence products and geometric means are over the sequence's response tokens; log-ratios are clamped to
[-20, 20] before `exp` (verl's safety bound), so a product never overflows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.algorithms.base import kl_k3, masked_max, masked_mean

PRESETS = ("none", "token_tis", "seq_tis", "token_mis", "seq_mis", "geo_rs", "icepop")

DEFAULT_BANDS = {"token_mis": (0.5, 2.0), "seq_mis": (0.5, 2.0), "geo_rs": (0.999, 1.001), "icepop": (0.5, 5.0)}
"""[low, high] of the presets with a band, when algorithm.rc_low / rc_high are not set."""

LOG_BOUND = 20.0


@dataclass
class Correction:
    weight: torch.Tensor  # [B, T] importance weight per token, no gradient (0 outside the response)
    keep: torch.Tensor  # [B, T] 1.0 where the token stays in the loss and its denominator


def band(cfg: Any) -> tuple[float, float]:
    """The preset's [low, high]: algorithm.rc_low / rc_high where set, else the preset's default."""
    low, high = DEFAULT_BANDS.get(cfg.rollout_correction, (0.0, float("inf")))
    return (low if cfg.rc_low is None else cfg.rc_low), (high if cfg.rc_high is None else cfg.rc_high)


def _inside(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    return ((x >= low) & (x <= high)).to(x.dtype)


def rollout_correction(log_ratio: torch.Tensor, mask: torch.Tensor, preset: str, cap: float, low: float, high: float) -> Correction:
    """Weight and keep mask [B, T] of `preset` from log rho [B, T] on the response tokens of `mask`."""
    log_ratio = (log_ratio * mask).clamp(-LOG_BOUND, LOG_BOUND).detach()
    n = mask.sum(-1, keepdim=True).clamp(min=1.0)  # [B, 1] response tokens
    seq_log = (log_ratio.sum(-1, keepdim=True).clamp(-LOG_BOUND, LOG_BOUND)).expand_as(mask)  # log prod rho
    rho, ones = torch.exp(log_ratio), torch.ones_like(mask)
    if preset == "none":
        weight, keep = ones, ones
    elif preset == "token_tis":
        weight, keep = rho.clamp(max=cap), ones
    elif preset == "seq_tis":
        weight, keep = torch.exp(seq_log).clamp(max=cap), ones
    elif preset == "token_mis":
        weight, keep = rho, _inside(rho, low, high)
    elif preset == "seq_mis":
        weight = torch.exp(seq_log)
        weight, keep = weight, _inside(weight, low, high)
    elif preset == "geo_rs":
        geo = torch.exp(log_ratio.sum(-1, keepdim=True) / n).expand_as(mask)
        weight, keep = ones, _inside(geo, low, high)
    elif preset == "icepop":
        weight, keep = rho * _inside(rho, low, high), ones
    else:
        raise ValueError(f"unknown rollout_correction {preset!r}; one of {', '.join(PRESETS)}")
    return Correction(weight * mask, keep * mask)


def correct(anchor_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor, cfg: Any) -> Correction:
    """`rollout_correction` with algorithm.* settings: rho = pi_anchor / pi_behav."""
    low, high = band(cfg)
    return rollout_correction(anchor_logprobs - behavior_logprobs, mask, cfg.rollout_correction, cfg.is_cap, low, high)


@torch.no_grad()
def mismatch_metrics(proximal_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor, fresh: torch.Tensor,
                     cfg: Any) -> dict[str, float]:
    """The engine's log-probs against the learner's on the rows [B] whose every token the learner's current weights
    sampled (`fresh`): what is left there is kernel and dtype mismatch, not staleness.

    mismatch/k3: mean k3 estimate of KL(pi_behav || pi_learner) per token (r - 1 - log r, r = pi_learner / pi_behav);
    mismatch/ratio_max: the largest r; mismatch/frac_masked: tokens the preset drops or weighs 0 (its mask) out of
    those tokens; mismatch/samples: the rows counted (with none, only it is reported)."""
    m = mask * fresh[:, None].to(mask.dtype)
    out = {"mismatch/samples": float(fresh.sum().item())}
    if m.sum() == 0:
        return out
    corr = correct(proximal_logprobs, behavior_logprobs, m, cfg)
    dropped = ((corr.keep == 0) | (corr.weight == 0)).to(m.dtype)
    out.update({
        "mismatch/k3": masked_mean(kl_k3(behavior_logprobs, proximal_logprobs), m).item(),
        "mismatch/ratio_max": masked_max(torch.exp(proximal_logprobs - behavior_logprobs), m).item(),
        "mismatch/frac_masked": masked_mean(dropped, m).item(),
    })
    return out
