"""Verifiable tasks: a train prompt stream, a held-out eval set, and the factory that builds the one a config names.

A task is chosen by name in config (`task.name`); its reward by name or by a
dotted path to a user function (`task.reward: my_pkg.rewards.my_fn`). Every
reward function has the signature ``reward(prompt: Prompt, response: str) -> float`` (asyncrl.core.rewards).

Built-in tasks:
- ``addition``: multi-digit addition; the prompt is ``"37+85="`` and the
  reward (``exact_match``) is 1.0 when the response is exactly the sum.
- ``word_problems``: arithmetic word problems of 1 to `task.steps` operations for instruct models
  ("Ben has 4 pencils. Ben loses 1 pencils. How many ...? End your reply with ... 'Answer: N'."),
  rewarded by ``numeric_match`` on the response's last number.
- ``dataset``: prompts and reference answers from your own files (the `data` section: JSONL, JSON, Parquet or
  Arrow, read by the Hugging Face ``datasets`` library; asyncrl.core.datasets). Each prompt carries every column
  of its record (`Prompt.record`). The older ``jsonl`` task (`task.path`, ...) is read into this one.

A reward may also be a function in a Python file, ``task.reward: path/to/file.py:fn``, and a verl-style
``compute_score(data_source, solution_str, ground_truth, extra_info)`` is adapted (asyncrl.core.reward_files).
"""
from __future__ import annotations

import random
from collections.abc import Iterator

from asyncrl.core.envs import Environment, environment_tasks, make_environment
from asyncrl.core.prompts import Prompt


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

    def __init__(self, digits: int = 2, eval_size: int = 200, seed: int = 0, dev_size: int = 0) -> None:
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
        rng, dev = random.Random(f"addition-dev-{seed}"), set()
        while len(dev) < min(dev_size, hi * hi // 4):
            pair = (rng.randrange(hi), rng.randrange(hi))
            if pair not in self._eval_set:
                dev.add(pair)
        self._dev = sorted(dev)
        self._held = self._eval_set | dev  # never trained on

    def _prompt(self, a: int, b: int) -> Prompt:
        return Prompt(prompt_id=f"{a}+{b}", text=f"{a}+{b}=", answer=str(a + b))

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(a, b) for a, b in self._eval]

    def dev_prompts(self) -> list[Prompt]:
        """`task.dev_size` problems for tuning, apart from the eval problems and never trained on."""
        return [self._prompt(a, b) for a, b in self._dev]

    def is_eval(self, a: int, b: int) -> bool:
        return (a, b) in self._eval_set

    def train_pairs(self, seed: int) -> Iterator[tuple[int, int]]:
        """Endless stream of operand pairs outside the eval set, deterministic for `seed`."""
        rng = random.Random(seed)
        hi = 10**self.digits
        while True:
            a, b = rng.randrange(hi), rng.randrange(hi)
            if (a, b) not in self._held:
                yield a, b

    def train_prompts(self, seed: int, start: int = 0) -> Iterator[Prompt]:
        """Endless prompt stream; `start` skips that many prompts (a data cursor)."""
        for i, (a, b) in enumerate(self.train_pairs(seed)):
            if i >= start:
                yield self._prompt(a, b)


NAMES = ("Ana", "Ben", "Carla", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kai", "Lena", "Mo", "Nia", "Omar", "Pia")
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "coins", "stamps", "shells", "cards")
ANSWER_FORMAT = "\nEnd your reply with the final answer in the form 'Answer: N'."


def word_problem(rng: random.Random, steps: int) -> tuple[str, int]:
    """A word problem of `steps` operations (add, take away, multiply by 2-4) on a count of objects, and its answer.
    Counts stay positive; multiplying is offered only while the count is at most 10."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(2, 20)
    parts = [f"{name} has {total} {item}."]
    for _ in range(steps):
        op = rng.choice(("add", "sub", "mul") if total <= 10 else ("add", "sub"))
        if op == "add":
            b = rng.randint(2, 15)
            total += b
            parts.append(rng.choice((f"Then {name} gets {b} more.", f"A friend gives {name} {b} more {item}.")))
        elif op == "sub" and total > 2:
            b = rng.randint(1, total - 1)
            total -= b
            parts.append(rng.choice((f"Then {name} gives away {b}.", f"{name} loses {b} {item}.")))
        else:
            b = rng.randint(2, 4)
            total *= b
            parts.append(f"Then the number of {item} {name} has becomes {b} times as many.")
    parts.append(f"How many {item} does {name} have now?")
    return " ".join(parts), total


class WordProblemTask:
    """Arithmetic word problems of 1 to `steps` operations, asked for an 'Answer: N' ending (pair with
    ``numeric_match``, which reads the response's last number). Procedural, so nothing is downloaded; the
    held-out problems never appear in training. Built for instruct models with `task.chat`: SmolLM2-135M-Instruct
    reasons at very different lengths on them (docs/recipes.md, "The task")."""

    name = "word_problems"

    def __init__(self, steps: int = 2, eval_size: int = 200, seed: int = 0, dev_size: int = 0) -> None:
        if steps < 1:
            raise ValueError(f"task.steps must be >= 1, got {steps}")
        self.steps = steps
        rng = random.Random(f"word-problems-eval-{seed}")
        evals: dict[str, int] = {}
        while len(evals) < eval_size:
            text, answer = word_problem(rng, rng.randint(1, steps))
            evals.setdefault(text, answer)
        self._eval = [Prompt(f"eval-{i}", text + ANSWER_FORMAT, str(a)) for i, (text, a) in enumerate(evals.items())]
        rng, devs = random.Random(f"word-problems-dev-{seed}"), {}
        while len(devs) < dev_size:
            text, answer = word_problem(rng, rng.randint(1, steps))
            if text not in evals:
                devs.setdefault(text, answer)
        self._dev = [Prompt(f"dev-{i}", text + ANSWER_FORMAT, str(a)) for i, (text, a) in enumerate(devs.items())]
        self._eval_texts = frozenset(evals) | frozenset(devs)  # never trained on

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

    def dev_prompts(self) -> list[Prompt]:
        """`task.dev_size` problems for tuning, apart from the eval problems and never trained on."""
        return list(self._dev)

    def train_prompts(self, seed: int, start: int = 0) -> Iterator[Prompt]:
        """Endless problems outside the eval set, deterministic for `seed`; `start` skips that many (a data cursor)."""
        rng = random.Random(f"word-problems-train-{seed}")
        i = 0
        while True:
            text, answer = word_problem(rng, rng.randint(1, self.steps))
            if text in self._eval_texts:
                continue
            if i >= start:
                yield Prompt(f"train-{seed}-{i}", text + ANSWER_FORMAT, str(answer))
            i += 1


class EpisodeTask:
    """The task records of a built-in environment (`Environment.record`): a held-out set and an endless train
    stream, both deterministic for the seed, as the single-turn tasks are."""

    def __init__(self, env: type[Environment], task, seed: int) -> None:
        self.env, self.task, self.seed = env, task, seed
        rng = random.Random(f"{env.name}-eval-{seed}")
        self._eval = [Prompt(f"eval-{i}", *env.record(rng, task)) for i in range(task.eval_size)]

    @property
    def name(self) -> str:
        return self.env.name

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

    def train_prompts(self, seed: int, start: int = 0):
        """Endless records; `start` skips that many (a data cursor)."""
        rng = random.Random(f"{self.env.name}-train-{seed}")
        i = 0
        while True:
            text, answer = self.env.record(rng, self.task)
            if i >= start:
                yield Prompt(f"train-{seed}-{i}", text, answer)
            i += 1


TASKS = ("addition", "dataset", "word_problems")


def make_task(cfg, seed: int, data=None):
    """The task a `TaskConfig` names: a single-turn task, your files (task.name=dataset, read from `data`, the
    `DataConfig`), or an environment's own records (asyncrl.core.tasks.EpisodeTask: task.name=calculator or
    guess_number, or the dotted path of a user's Environment subclass with a `record`)."""
    if cfg.name in environment_tasks():
        return EpisodeTask(environment_tasks()[cfg.name], cfg, seed)
    if "." in cfg.name:
        return EpisodeTask(make_environment(cfg.name), cfg, seed)
    if cfg.name == "addition":
        return AdditionTask(digits=cfg.digits, eval_size=cfg.eval_size, seed=seed, dev_size=cfg.dev_size)
    if cfg.name == "word_problems":
        return WordProblemTask(steps=cfg.steps, eval_size=cfg.eval_size, seed=seed, dev_size=cfg.dev_size)
    if cfg.name == "dataset":
        from asyncrl.core.datasets import DataTask  # the datasets library only where this task is used

        if data is None:
            raise ValueError("task.name=dataset reads the data section: pass it to make_task")
        return DataTask(data, cfg.chat, cfg.eval_size)
    raise ValueError(f"unknown task {cfg.name!r}; built-in: {', '.join(TASKS + tuple(environment_tasks()))}")
