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
- ``jsonl``: prompts and reference answers from a local JSONL file
  (`task.path`, e.g. GSM8K's ``{"question": ..., "answer": "... #### 72"}``
  with ``prompt_key: question``); the last `eval_size` records are held out.
  Pair it with the ``numeric_match`` reward.
"""
from __future__ import annotations

import importlib
import json
import queue
import random
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
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
    reasons at very different lengths on them (README, "A real model")."""

    name = "word_problems"

    def __init__(self, steps: int = 2, eval_size: int = 200, seed: int = 0) -> None:
        if steps < 1:
            raise ValueError(f"task.steps must be >= 1, got {steps}")
        self.steps = steps
        rng = random.Random(f"word-problems-eval-{seed}")
        evals: dict[str, int] = {}
        while len(evals) < eval_size:
            text, answer = word_problem(rng, rng.randint(1, steps))
            evals.setdefault(text, answer)
        self._eval = [Prompt(f"eval-{i}", text + ANSWER_FORMAT, str(a)) for i, (text, a) in enumerate(evals.items())]
        self._eval_texts = frozenset(evals)

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

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


class JsonlTask:
    """Records of a local JSONL file; `template` (``{key}`` fields of a record) makes the prompt text."""

    name = "jsonl"

    def __init__(self, path: str, prompt_key: str = "prompt", answer_key: str = "answer", template: str = "", eval_size: int = 200) -> None:
        self.prompts = [self._prompt(i, r, prompt_key, answer_key, template) for i, r in enumerate(read_jsonl(path), 1)]
        if len(self.prompts) <= eval_size:
            raise ValueError(f"task.path {path}: {len(self.prompts)} records, need more than task.eval_size={eval_size}")
        self._train, self._eval = self.prompts[:-eval_size], self.prompts[-eval_size:]

    @staticmethod
    def _prompt(line: int, record: dict, prompt_key: str, answer_key: str, template: str) -> Prompt:
        for key in (prompt_key, answer_key):
            if key not in record:
                raise ValueError(f"task.path line {line}: no key {key!r} (keys: {sorted(record)})")
        try:
            text = template.format(**record) if template else str(record[prompt_key])
        except KeyError as exc:
            raise ValueError(f"task.template names {exc} which line {line} lacks") from exc
        if not text.strip():
            raise ValueError(f"task.path line {line}: empty prompt")
        return Prompt(prompt_id=str(record.get("id", line)), text=text, answer=str(record[answer_key]))

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

    def train_prompts(self, seed: int, start: int = 0) -> Iterator[Prompt]:
        """Endless epochs over the training records, each shuffled by (seed, epoch); `start` skips prompts."""
        i, epoch = 0, 0
        while True:
            order = list(self._train)
            random.Random(seed * 100_003 + epoch).shuffle(order)
            for prompt in order:
                if i >= start:
                    yield prompt
                i += 1
            epoch += 1


def read_jsonl(path: str) -> list[dict]:
    """Every record of a JSONL file; errors name the file and line."""
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as exc:
        raise ValueError(f"task.path: cannot read {path!r}: {exc.strerror}") from exc
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"task.path {path} line {n}: not JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise ValueError(f"task.path {path} line {n}: expected a JSON object")
        records.append(record)
    if not records:
        raise ValueError(f"task.path {path}: no records")
    return records


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


TASKS = ("addition", "jsonl", "word_problems")
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


def make_task(cfg, seed: int):
    """The task a `TaskConfig` names: a single-turn task, or an environment's own records (asyncrl.core.envs.EpisodeTask:
    task.name=calculator or guess_number, or the dotted path of a user's Environment subclass with a `record`)."""
    from asyncrl.core.envs import EpisodeTask, environment_tasks, make_environment  # envs builds on this module

    if cfg.name in environment_tasks():
        return EpisodeTask(environment_tasks()[cfg.name], cfg, seed)
    if "." in cfg.name:
        return EpisodeTask(make_environment(cfg.name), cfg, seed)
    if cfg.name == "addition":
        return AdditionTask(digits=cfg.digits, eval_size=cfg.eval_size, seed=seed)
    if cfg.name == "word_problems":
        return WordProblemTask(steps=cfg.steps, eval_size=cfg.eval_size, seed=seed)
    if cfg.name == "jsonl":
        return JsonlTask(cfg.path, cfg.prompt_key, cfg.answer_key, cfg.template, cfg.eval_size)
    raise ValueError(f"unknown task {cfg.name!r}; built-in: {', '.join(TASKS + tuple(environment_tasks()))}")


def make_reward(name: str) -> RewardFn:
    """A registered reward by name, or a user function by dotted path."""
    if name in REWARDS:
        return REWARDS[name]
    fn = load_object(name)
    if not callable(fn):
        raise ValueError(f"reward {name!r} is not callable")
    return fn  # type: ignore[return-value]


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
