"""Verifiable tasks: a train prompt stream, a held-out eval set and a rule-based reward.

A task is chosen by name in config (`task.name`); its reward by name or by a
dotted path to a user function (`task.reward: my_pkg.rewards.my_fn`). Every
reward function has the signature ``reward(prompt: Prompt, response: str) -> float``.

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

import hashlib
import importlib
import json
import queue
import random
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

RewardFn = Callable[["Prompt", str], float]

TINY_HELD_OUT = 200
"""Eval problems the tiny model's warm-start never trains on (a larger eval set would leak)."""


def _frozen(value: Any) -> Any:
    """`value` with every mapping in it a Record and every list a tuple."""
    if isinstance(value, Mapping):
        return Record(value)
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    """The plain dicts and lists of a frozen value (what JSON, a chat template or a verl reward expects)."""
    if isinstance(value, Record):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


class Record(Mapping):
    """A data record's columns, read-only: nested mappings are Records, lists are tuples. Unlike
    types.MappingProxyType it pickles (prompts travel between Ray actors), and it hashes (by its content)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping | None = None) -> None:
        self._data = {str(k): _frozen(v) for k, v in (data or {}).items()}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Record({self._data!r})"

    def __reduce__(self) -> tuple:
        return Record, (self.to_dict(),)

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def to_dict(self) -> dict[str, Any]:
        """A plain, mutable copy (dicts and lists all the way down)."""
        return _thawed(self)

    def fingerprint(self) -> str:
        """A digest of the content (equal records, equal digests): part of the reward cache's key."""
        text = json.dumps(self.to_dict(), sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Prompt:
    """One task instance: the text shown to the policy and the reference answer; a dataset's prompt also carries its
    chat turns and every column of its record."""

    prompt_id: str
    text: str
    """The prompt as text (for a chat-message prompt: its last user turn), as the trajectory store records it."""
    answer: str
    messages: tuple[Record, ...] = ()
    """Chat turns ({role, content}) the policy is given instead of `text` (needs task.chat); empty: `text`."""
    record: Record = field(default_factory=Record)
    """Every column of the prompt's data record, read-only, for the reward (empty for procedural tasks)."""

    @property
    def content(self) -> str | list[dict]:
        """What encode_prompt renders: the chat turns when there are, else the text."""
        return [m.to_dict() for m in self.messages] if self.messages else self.text


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


TASKS = ("addition", "dataset", "word_problems")
REWARDS: dict[str, RewardFn] = {"exact_match": exact_match, "numeric_match": numeric_match}


def encode_prompt(tokenizer, text: str | list[dict], chat: bool) -> list[int]:
    """The token ids the engine is given for a prompt: the text as it is, or (`task.chat`) one user turn in the
    tokenizer's chat template with the assistant's turn opened; a list of chat messages (an environment's opening,
    e.g. a worked example before the question) is rendered as it is. The template is rendered to text and encoded
    without adding special tokens again: `apply_chat_template(tokenize=True)` returns a `BatchEncoding` in
    transformers 5, whose `list()` is its key names, and a BOS the template already holds must not be doubled."""
    if not isinstance(text, str):
        if not chat:
            raise ValueError("chat messages need task.chat=true")
        messages = list(text)
    elif not chat:
        return list(tokenizer(text).input_ids)
    else:
        messages = [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(rendered, add_special_tokens=False).input_ids)


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


def make_task(cfg, seed: int, data=None):
    """The task a `TaskConfig` names: a single-turn task, your files (task.name=dataset, read from `data`, the
    `DataConfig`), or an environment's own records (asyncrl.core.envs.EpisodeTask: task.name=calculator or
    guess_number, or the dotted path of a user's Environment subclass with a `record`)."""
    from asyncrl.core.envs import EpisodeTask, environment_tasks, make_environment  # envs builds on this module

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


def make_reward(name: str) -> RewardFn:
    """A registered reward by name, a function in a Python file (``path/to/file.py:fn``), or a user function by
    dotted path; a verl-style ``compute_score`` is adapted to ``(prompt, response)`` (asyncrl.core.reward_files)."""
    from asyncrl.core.reward_files import as_reward, load_reward_file, reward_file_spec  # it builds on this module

    if name in REWARDS:
        return REWARDS[name]
    spec = reward_file_spec(name)
    return as_reward(load_reward_file(*spec) if spec is not None else load_object(name), name)


class RewardTimeout(Exception):
    """A reward call ran past its timeout (its thread may still be running it)."""


class RewardThreadsStuck(RuntimeError):
    """Every reward thread is still inside a call that timed out: no reward can run."""


class RewardRunner:
    """Calls a reward function on a few daemon threads, with a timeout per call.

    ``runner(prompt, response)`` returns the reward as a float, raises what the
    function raises, `RewardTimeout` when it takes longer than `timeout_s`, and
    `RewardThreadsStuck` when no thread is left to run it. The caller still
    waits for the call (up to `timeout_s`), so a slow reward slows generation,
    but a hung one cannot block it forever.

    Python cannot kill a thread: a call that timed out is abandoned, not
    stopped, and its thread stays busy until the function returns, maybe
    never. The damage is bounded by `threads`: once every thread is held by
    such a call, each further call raises `RewardThreadsStuck` at once (the
    rollout worker then reports an error). The threads are daemons, so a hung
    call does not keep the process from exiting. Calls are meant to come one at
    a time (from the rollout loop, or from evaluation while the loop is
    stopped); concurrent callers are serialised.
    """

    def __init__(self, fn: RewardFn, timeout_s: float = 30.0, threads: int = 4, name: str = "reward") -> None:
        if timeout_s <= 0:
            raise ValueError(f"reward timeout must be > 0 s, got {timeout_s}")
        if threads < 1:
            raise ValueError(f"reward threads must be >= 1, got {threads}")
        self.fn, self.timeout_s, self.threads, self.name = fn, timeout_s, threads, name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._abandoned: list[Future] = []  # calls that timed out, maybe still running
        self._started = 0

    @property
    def stuck(self) -> int:
        """Threads still inside a call that timed out (safe to read from any thread)."""
        return sum(not f.done() for f in list(self._abandoned))

    def __call__(self, prompt: Prompt, response: str) -> float:
        with self._lock:
            self._abandoned = [f for f in self._abandoned if not f.done()]
            if self.stuck >= self.threads:
                raise RewardThreadsStuck(
                    f"all {self.threads} reward threads are stuck in calls that ran past {self.timeout_s:g} s (Python cannot stop them)"
                )
            if self._started < self.threads and self._started <= self.stuck:  # every started thread is held: start another
                threading.Thread(target=self._serve, name=f"{self.name}-{self._started}", daemon=True).start()
                self._started += 1
            future: Future = Future()
            self._calls.put((future, prompt, response))
            if not wait([future], timeout=self.timeout_s).done:
                if not future.cancel():  # already running: its thread is held until the call returns
                    self._abandoned.append(future)
                raise RewardTimeout(f"reward timed out after {self.timeout_s:g} s")
        return float(future.result())  # raises what the function raised

    def _serve(self) -> None:
        while True:
            future, prompt, response = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self.fn(prompt, response))
            except Exception as exc:  # handed to the caller
                future.set_exception(exc)
            except BaseException as exc:  # SystemExit and the like: the caller gets an ordinary error, the thread lives on
                future.set_exception(RuntimeError(f"{exc!r}"))
