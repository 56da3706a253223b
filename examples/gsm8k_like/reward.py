"""A verl-style reward for the records of make_data.py: ``task.reward: examples/gsm8k_like/reward.py:compute_score``.

asyncrl calls it with verl's keywords: data_source and extra_info from the record's columns, ground_truth from its
reward_model.ground_truth. Each record's prompt asks for the final answer after its own marker
(extra_info["answer_format"], "####" or "Answer:"): the number after that marker scores 1.0; the right number
without the marker, as the response's last number, scores `FORMAT_MISS` (a small model learns the format from there).
"""
from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
FORMAT_MISS = 0.5


def number(text: str, last: bool) -> str | None:
    """The first (or last) number in `text`, commas dropped."""
    found = NUMBER.findall(text)
    return found[-1 if last else 0].replace(",", "").rstrip(".") if found else None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    marker = (extra_info or {}).get("answer_format", "####")
    if marker in solution_str and number(solution_str.rsplit(marker, 1)[1], last=False) == ground_truth:
        return 1.0
    return FORMAT_MISS if number(solution_str, last=True) == ground_truth else 0.0
