"""Verifiable tasks: a train prompt stream, a held-out eval set and a rule-based reward.

A task is chosen by name in config (`task.name`); its reward by name or by a
dotted path to a user function (`task.reward: my_pkg.rewards.my_fn`). Every
reward function has the signature ``reward(prompt: Prompt, response: str) -> float``.

The built-in task is multi-digit addition: the prompt is ``"37+85="`` and the
reward is 1.0 when the response, up to the end-of-sequence, is exactly the sum.
"""
from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

RewardFn = Callable[["Prompt", str], float]

TINY_HELD_OUT = 200
"""Eval problems the tiny model's warm-start never trains on (a larger eval set would leak)."""


@dataclass(frozen=True)
class Prompt:
    """One task instance: the text shown to the policy and the reference answer."""

    prompt_id: str
    text: str
    answer: str


def carry_free_sum(a: int, b: int) -> int:
    """Digit-wise sum that drops every carry (the habit the warm-start data mixes in)."""
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


class AdditionTask:
    """``a+b=`` with operands of `digits` digits; eval problems never appear in training."""

    name = "addition"

    def __init__(self, digits: int = 2, eval_size: int = 200, seed: int = 0) -> None:
        if digits < 1 or digits > 6:
            raise ValueError(f"task.digits must be in 1..6, got {digits}")
        self.digits = digits
        hi = 10**digits
        rng = random.Random(seed)
        pairs: set[tuple[int, int]] = set()
        while len(pairs) < min(eval_size, hi * hi // 4):
            pairs.add((rng.randrange(hi), rng.randrange(hi)))
        self._eval = sorted(pairs)
        self._eval_set = frozenset(self._eval)

    def _prompt(self, a: int, b: int) -> Prompt:
        return Prompt(prompt_id=f"{a}+{b}", text=f"{a}+{b}=", answer=str(a + b))

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(a, b) for a, b in self._eval]

    def is_eval(self, a: int, b: int) -> bool:
        return (a, b) in self._eval_set

    def train_pairs(self, seed: int) -> Iterator[tuple[int, int]]:
        """Endless stream of operand pairs outside the eval set, deterministic for `seed`."""
        rng = random.Random(seed)
        hi = 10**self.digits
        while True:
            a, b = rng.randrange(hi), rng.randrange(hi)
            if (a, b) not in self._eval_set:
                yield a, b

    def train_prompts(self, seed: int, start: int = 0) -> Iterator[Prompt]:
        """Endless prompt stream; `start` skips that many prompts (a data cursor)."""
        for i, (a, b) in enumerate(self.train_pairs(seed)):
            if i >= start:
                yield self._prompt(a, b)


def exact_match(prompt: Prompt, response: str) -> float:
    """1.0 when the response (whitespace stripped) equals the answer, else 0.0."""
    return 1.0 if response.strip() == prompt.answer else 0.0


TASKS: dict[str, type[AdditionTask]] = {"addition": AdditionTask}
REWARDS: dict[str, RewardFn] = {"exact_match": exact_match}


def load_object(dotted: str) -> object:
    """Import ``pkg.module.attr``; raise ValueError naming the path when it cannot."""
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"{dotted!r} is not a dotted path (expected pkg.module.name)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for {dotted!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def make_task(name: str, digits: int, eval_size: int, seed: int) -> AdditionTask:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; registered: {sorted(TASKS)}")
    return TASKS[name](digits=digits, eval_size=eval_size, seed=seed)


def make_reward(name: str) -> RewardFn:
    """A registered reward by name, or a user function by dotted path."""
    if name in REWARDS:
        return REWARDS[name]
    fn = load_object(name)
    if not callable(fn):
        raise ValueError(f"reward {name!r} is not callable")
    return fn  # type: ignore[return-value]
