"""Rule-based rewards by name (`task.reward`), and `make_reward`, which also finds a user's reward by dotted path
or in a Python file (asyncrl.core.reward_files). Every reward is ``reward(prompt: Prompt, response: str) -> float``."""
from __future__ import annotations

import re

from asyncrl.core.plugins import load_object
from asyncrl.core.prompts import Prompt, RewardFn
from asyncrl.core.reward_files import as_reward, load_reward_file, reward_file_spec

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> str | None:
    """The answer after GSM8K's ``####`` if present, else the last number in `text` (commas dropped)."""
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def numeric_match(prompt: Prompt, response: str) -> float:
    """1.0 when the response's final number equals the reference's (GSM8K-style answers)."""
    want, got = final_number(prompt.answer), final_number(response)
    if want is None or got is None:
        return 0.0
    try:
        return 1.0 if float(want) == float(got) else 0.0
    except ValueError:
        return 0.0


def exact_match(prompt: Prompt, response: str) -> float:
    """1.0 when the response (whitespace stripped) equals the answer, else 0.0."""
    return 1.0 if response.strip() == prompt.answer else 0.0


REWARDS: dict[str, RewardFn] = {"exact_match": exact_match, "numeric_match": numeric_match}


def make_reward(name: str) -> RewardFn:
    """A registered reward by name, a function in a Python file (``path/to/file.py:fn``), or a user function by
    dotted path; a verl-style ``compute_score`` is adapted to ``(prompt, response)`` (asyncrl.core.reward_files)."""
    if name in REWARDS:
        return REWARDS[name]
    spec = reward_file_spec(name)
    return as_reward(load_reward_file(*spec) if spec is not None else load_object(name), name)
