"""What the learner and the buffer see of a sample's reward: the task's, plus DAPO's soft over-long penalty; and
the zero-variance test of dynamic sampling. Pure functions; the recorded `reward` stays the task's."""
from __future__ import annotations

from asyncrl.core.config import AlgorithmConfig


def overlong_penalty(length: int, max_new_tokens: int, buffer: int, factor: float) -> float:
    """DAPO's soft over-long punishment: 0 up to max_new_tokens - buffer tokens, then falling linearly to -factor at
    max_new_tokens (a response cannot be longer: the engine cuts it there)."""
    start = max_new_tokens - buffer
    if factor == 0 or length <= start:
        return 0.0
    return -factor * min(length - start, buffer) / buffer


def shaped_reward(record: dict, algo: AlgorithmConfig, max_new_tokens: int) -> float:
    """The reward advantages are computed from: the task's plus the over-long penalty."""
    return float(record["reward"]) + overlong_penalty(len(record["response_ids"]), max_new_tokens, algo.overlong_buffer,
                                                      algo.overlong_penalty)


def zero_variance(rewards: list[float]) -> bool:
    """Every reward of the group equal: group-relative advantages are all 0, the group teaches nothing."""
    return max(rewards) == min(rewards)
