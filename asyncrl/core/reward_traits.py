"""What a reward function says of itself, for the reward pool: `@reward(batched=..., deterministic=..., version=...)`.

A reward is `fn(prompt, response) -> float` (per sample) or, marked `@reward(batched=True)`,
`fn(prompts, responses) -> list[float]`. Only a deterministic reward's results are cached, keyed with its
`version` (change it when the function changes). An unmarked function is per sample, deterministic, version 1.

    from asyncrl.core.reward_traits import reward

    @reward(batched=True)
    def judge(prompts, responses): ...
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.core.prompts import Prompt


def reward(batched: bool = False, deterministic: bool = True, version: str = "1") -> Callable:
    """Mark a reward function: `batched` takes lists and returns one float per pair; a non-deterministic one is
    never cached; `version` is part of the cache key."""
    def mark(fn: Callable) -> Callable:
        fn.asyncrl_reward = RewardTraits(batched, deterministic, str(version))
        return fn
    return mark


@dataclass(frozen=True)
class RewardTraits:
    batched: bool = False
    deterministic: bool = True
    version: str = "1"


def traits_of(fn: Callable) -> RewardTraits:
    """What `@reward` said of `fn` (an unmarked function is per-sample, deterministic, version 1)."""
    traits = getattr(fn, "asyncrl_reward", None)  # an attribute users set through @reward, not a duck-typing guess
    return traits if isinstance(traits, RewardTraits) else RewardTraits()


def per_sample(fn: Callable) -> Callable[[Prompt, str], float]:
    """`fn` as `(prompt, response) -> float`: a batched reward is called with one pair."""
    if not traits_of(fn).batched:
        return fn
    return lambda prompt, response: fn([prompt], [response])[0]
