"""Validation during training, the pure part: pass@k, the held-out problems shared among rollout workers, and the
`eval/` step metrics from what the workers return.

The rollout workers generate and score (asyncrl.actors.rollout `evaluate_live`); the controller splits the
problems, merges the answers and logs these metrics at the step whose published version was evaluated.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

SOLVED = 1.0
"""A sampled response solves its problem when its score reaches this (the built-in rewards give 1.0 to a right answer)."""

T = TypeVar("T")


@dataclass(frozen=True)
class EvalScores:
    """One evaluation of held-out problems, each list in the problems' order."""
    greedy: list[float]  # each problem's greedy score
    greedy_tokens: list[int]  # each greedy response's length
    greedy_truncated: list[bool]  # each greedy response was cut at rollout.max_new_tokens
    solved: list[int]  # each problem's sampled responses (of `samples`) that scored >= SOLVED
    samples: int = 0  # responses sampled per problem at the rollout temperature (0: none)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c are correct: 1 - C(n-c, k) / C(n, k), the chance that k
    samples drawn without replacement from the n include a correct one."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n correct samples, got c={c}, n={n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def split_evenly(items: Sequence[T], parts: int) -> list[list[T]]:
    """`items` in `parts` contiguous shares whose sizes differ by at most one (the first ones larger); in order."""
    size, extra = divmod(len(items), parts)
    shares, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        shares.append(list(items[start:end]))
        start = end
    return shares


def merge(shares: Sequence[EvalScores]) -> EvalScores:
    """The evaluations of consecutive shares of the problems as one, in order."""
    samples = {s.samples for s in shares}
    if len(samples) > 1:
        raise ValueError(f"shares sampled different numbers of responses per problem: {sorted(samples)}")
    return EvalScores(
        greedy=[x for s in shares for x in s.greedy], greedy_tokens=[x for s in shares for x in s.greedy_tokens],
        greedy_truncated=[x for s in shares for x in s.greedy_truncated], solved=[x for s in shares for x in s.solved],
        samples=samples.pop() if samples else 0,
    )


def eval_metrics(scores: EvalScores) -> dict[str, float]:
    """The `eval/` keys of one evaluation: greedy accuracy (mean score), greedy response length and truncation, and
    with samples: pass@1 (the mean share of solving samples) and pass@k for k = the samples per problem."""
    n = len(scores.greedy)
    if n == 0:
        raise ValueError("no held-out problems to evaluate")
    metrics = {
        "eval/accuracy": sum(scores.greedy) / n,
        "eval/response_len_mean": sum(scores.greedy_tokens) / n,
        "eval/truncated_frac": sum(scores.greedy_truncated) / n,
        "eval/problems": float(n),
    }
    k = scores.samples
    if k > 0:
        metrics["eval/pass_at_1"] = sum(pass_at_k(k, c, 1) for c in scores.solved) / n
        metrics["eval/pass_at_k"] = sum(pass_at_k(k, c, k) for c in scores.solved) / n
    return metrics
