"""Multi-turn environments (issue 18): the plugin API, tool calls, and an episode's token bookkeeping.

An environment plays one episode with the model. The rollout worker owns the loop:

1. `env = make_environment(name)(prompt, seed)`; `env.start()` gives the first user message.
2. The engine samples a model turn (token in, token out: the engine is given the episode's exact tokens).
3. `env.tool_call(text)` parses a tool call from the turn. If there is one, the worker runs `env.tools[name]`
   on its argument in a separate process, off the engine loop, killed at its timeout, and `env.tool_result`
   turns the result into the next step. Otherwise `env.step(text)` answers the turn (a game's reply, or the
   final answer checked).
4. An `EnvStep` that is not done carries the observation; it is tokenised once (`observation_ids`) and
   appended to the episode's tokens, and the next model turn continues from exactly those tokens.

Tools are plain top-level functions `str -> str` (picklable by reference), so a slow or hung tool never holds
the environment's state or the engine. Environments are found like algorithms: a built-in name
(`ENVIRONMENTS`), or a dotted path to a subclass of `Environment`.
"""
from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from asyncrl.core.tasks import Prompt, final_number, load_object

# ---- the plugin API --------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A tool the model asked for: its name and its argument, as written."""

    name: str
    argument: str


@dataclass(frozen=True)
class EnvStep:
    """What the environment says after a model turn: the observation to append (when not done), or the reward and
    why the episode ended (when done)."""

    observation: str = ""
    done: bool = False
    reward: float = 0.0
    reason: str = ""


class Environment:
    """One episode. Subclass it, give it a `name` and override `start` and `step`; list the tools the model may
    call in `tools` and say how a call is written in `tool_call` (the default reads `<tool>name: argument</tool>`).

    `seed` is the episode's own (the worker derives it from the run's seed and the sample id), so an episode
    replays exactly."""

    name: ClassVar[str] = ""
    tools: ClassVar[dict[str, Callable[[str], str]]] = {}
    stop: ClassVar[tuple[str, ...]] = ()
    """Strings that end a model turn (the engine stops there), e.g. the end of a tool call."""

    def __init__(self, prompt: Prompt, seed: int) -> None:
        self.prompt, self.rng = prompt, random.Random(seed)

    @classmethod
    def record(cls, rng: random.Random, task) -> tuple[str, str]:
        """A built-in environment's own task: one record's (text, answer) drawn with `rng` (`task`: the task
        config). An environment without it plays the records of another task (`task.name`)."""
        raise NotImplementedError(f"environment {cls.name!r} has no records of its own: set task.name to a task")

    def start(self) -> str | list[dict]:
        """What the model sees first: the first user message (default: the prompt's text), or chat messages
        (with `task.chat`; e.g. a worked example as earlier turns, then the question)."""
        return self.prompt.text

    def tool_call(self, text: str) -> ToolCall | None:
        """The tool call in a model turn, if it makes one."""
        m = TOOL_RE.search(text)
        return ToolCall(m.group(1).strip(), m.group(2).strip()) if m else None

    def tool_result(self, call: ToolCall, result: str) -> EnvStep:
        """The step after a tool ran: by default its result, shown to the model."""
        return EnvStep(observation=f"<result>{result}</result>")

    def step(self, text: str) -> EnvStep:
        """Answer a model turn that made no tool call."""
        raise NotImplementedError


TOOL_RE = re.compile(r"<tool>\s*([\w.-]+)\s*:(.*?)</tool>", re.S)

_REGISTRY: dict[str, type[Environment]] = {}


def environment(cls: type[Environment]) -> type[Environment]:
    """Register a built-in environment under its `name`."""
    if not cls.name:
        raise ValueError(f"environment {cls.__qualname__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def registered_environments() -> list[str]:
    return sorted(_REGISTRY)


def environment_tasks() -> dict[str, type[Environment]]:
    """The built-in environments that bring their own task records (`Environment.record`), by name."""
    return {name: cls for name, cls in _REGISTRY.items() if cls.record.__func__ is not Environment.record.__func__}


def make_environment(name: str) -> type[Environment]:
    """A built-in environment by name, or a user's `Environment` subclass by dotted path."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if "." not in name:
        raise ValueError(f"unknown environment {name!r}; built-in: {', '.join(registered_environments())}")
    cls = load_object(name)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"environment {name!r} is not a subclass of asyncrl.core.envs.Environment")
    return cls


# ---- a calculator tool, and the task that needs it ------------------------------------------------

_OPS: dict[type, Callable] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg,
                              ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Integer arithmetic (+ - * // % and brackets) of an expression, or "error: ..." (never raises)."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Mult) and abs(left) * abs(right) > 10**18:
                raise ValueError("result too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not integer arithmetic: {ast.dump(node)[:40]}")

    try:
        return str(value(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as exc:
        return f"error: {exc}"


def arithmetic_problem(rng: random.Random, steps: int) -> tuple[str, int]:
    """An expression of `steps` + 1 numbers of 2-3 digits joined by + - *, and its value."""
    terms = [str(rng.randint(11, 999))]
    for _ in range(steps):
        terms += [rng.choice("+-*"), str(rng.randint(11, 99))]
    expression = " ".join(terms)
    return expression, int(calculator(expression))


@environment
class CalculatorEnv(Environment):
    """Multi-step arithmetic with a calculator the model must call: `<tool>calc: 347 * 29</tool>` is answered
    with `<result>10063</result>`; the episode ends at a turn without a tool call, and its reward is 1 when that
    turn's last number is the answer and the model called the calculator at least once."""

    name = "calculator"
    tools = {"calc": calculator}
    stop = ("</tool>",)
    PROMPT = ("Compute {expression}. Do not work it out yourself: first reply with only <tool>calc: {expression}</tool> "
              "and the calculator answers <result>VALUE</result>. Then reply with 'Answer: VALUE'.")

    EXAMPLE = "12 * 34"

    def __init__(self, prompt: Prompt, seed: int) -> None:
        super().__init__(prompt, seed)
        self.calls = 0

    def start(self) -> list[dict]:
        """A worked example (a call, its result, the answer) as earlier chat turns, then the question: a 135M
        instruct model never wrote a tool call from the instructions alone (0 of 24 sampled, measured)."""
        example = [
            {"role": "user", "content": self.PROMPT.format(expression=self.EXAMPLE)},
            {"role": "assistant", "content": f"<tool>calc: {self.EXAMPLE}</tool>"},
            {"role": "user", "content": f"<result>{calculator(self.EXAMPLE)}</result>"},
            {"role": "assistant", "content": f"Answer: {calculator(self.EXAMPLE)}"},
        ]
        return example + [{"role": "user", "content": self.prompt.text}]

    def tool_result(self, call: ToolCall, result: str) -> EnvStep:
        if call.name not in self.tools:
            return EnvStep(observation=f"<result>error: no tool {call.name!r}; the tool is calc</result>")
        self.calls += 1
        return super().tool_result(call, result)

    @classmethod
    def record(cls, rng: random.Random, task) -> tuple[str, str]:
        """An expression of 1 to `task.steps` operations; the answer is its value."""
        expression, answer = arithmetic_problem(rng, rng.randint(1, task.steps))
        return cls.PROMPT.format(expression=expression), str(answer)

    def step(self, text: str) -> EnvStep:
        correct = final_number(text) == self.prompt.answer
        if correct and not self.calls:
            return EnvStep(done=True, reward=0.0, reason="correct without calling the calculator")
        return EnvStep(done=True, reward=1.0 if correct else 0.0, reason="correct" if correct else "wrong answer")




# ---- a pure multi-turn game ---------------------------------------------------------------------


@environment
class GuessNumberEnv(Environment):
    """Guess a secret integer in [low, high] (the prompt's answer); each wrong guess is answered "higher" or
    "lower". Reward 1 for finding it; a turn without a number is answered with a reminder. The turn limit is the
    rollout's `env.max_turns` (the worker ends the episode there, reward 0)."""

    name = "guess_number"
    PROMPT = "I am thinking of a number from {low} to {high}. Guess it: reply with one number. I will say higher or lower."

    def start(self) -> list[dict]:
        """An example game (guesses 4, 6, 5 for a secret 5 in 1..8) as earlier chat turns, then this game: without
        it a 135M instruct model mostly chats instead of guessing (2 of 24 sampled games won, measured)."""
        turns = [("user", self.PROMPT.format(low=1, high=8)), ("assistant", "4"), ("user", "higher"), ("assistant", "6"),
                 ("user", "lower"), ("assistant", "5"), ("user", "Correct! New game. " + self.prompt.text)]
        return [{"role": role, "content": content} for role, content in turns]

    @classmethod
    def record(cls, rng: random.Random, task) -> tuple[str, str]:
        """A secret from 1 to `task.high`."""
        return cls.PROMPT.format(low=1, high=task.high), str(rng.randint(1, task.high))

    def step(self, text: str) -> EnvStep:
        guess = final_number(text)
        if guess is None:
            return EnvStep(observation="Reply with one number.")
        if guess == self.prompt.answer:
            return EnvStep(done=True, reward=1.0, reason="found")
        return EnvStep(observation="higher" if int(float(guess)) < int(self.prompt.answer) else "lower")




# ---- an episode's tokens -------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One span of an episode's response tokens: a model turn (sampled) or an observation (appended)."""

    role: str  # "model" | "observation"
    start: int  # offsets into the episode's response tokens
    end: int
    tool: str | None = None  # the tool a model turn called, or whose result an observation is
    text: str = ""  # the turn's text (a model turn's decoded from its tokens, for reading: the tokens are what counts)


@dataclass
class Episode:
    """The tokens of one episode after its prompt, exactly as they were sampled or appended: `response_ids`,
    with per token the loss mask (1 sampled, 0 appended), the behaviour log-prob and the policy version that
    sampled it (0.0 and -1 for appended tokens), and the turns' boundaries."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behavior_logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    def add_model_turn(self, ids: list[int], logprobs: list[float], versions: list[int], call: ToolCall | None = None, text: str = "") -> None:
        if not len(ids) == len(logprobs) == len(versions):
            raise ValueError(f"a model turn needs one log-prob and one version per token: {len(ids)}, {len(logprobs)}, {len(versions)}")
        start = len(self.response_ids)
        self._extend(ids, [1] * len(ids), logprobs, versions)
        self.turns.append(Turn("model", start, len(self.response_ids), call.name if call else None, text))

    def add_observation(self, ids: list[int], text: str, tool: str | None = None) -> None:
        start = len(self.response_ids)
        self._extend(ids, [0] * len(ids), [0.0] * len(ids), [-1] * len(ids))
        self.turns.append(Turn("observation", start, len(self.response_ids), tool, text))

    def _extend(self, ids, mask, lps, versions) -> None:
        self.response_ids += ids
        self.loss_mask += mask
        self.behavior_logprobs += lps
        self.token_versions += versions

    def next_input(self) -> list[int]:
        """The exact tokens the engine is given for the next model turn."""
        return self.prompt_ids + self.response_ids

    def model_turns(self) -> int:
        return sum(t.role == "model" for t in self.turns)

    def sampled_versions(self) -> list[int]:
        """The versions of the model-sampled tokens, in order (the episode's staleness is judged by the oldest)."""
        return [v for v, m in zip(self.token_versions, self.loss_mask) if m]


def observation_ids(tokenizer, text: str | list[dict], chat: bool, after_eos: bool = True) -> list[int]:
    """The tokens appended for an observation, tokenised once. With `task.chat` they are what the chat template
    puts between the end of an assistant turn and the start of the next one, with the observation as a user
    message (or `text`'s messages, an agent's: asyncrl.core.agents): the template's rendering of [user,
    assistant, user(text)] + generation prompt from just after the assistant's content on. When the model's turn ended with its own EOS (`after_eos`), that EOS is not
    repeated; a turn that ended otherwise (a stop string, its token limit) is closed by the template's EOS,
    appended like the rest. The model's own turn is never re-tokenised."""
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
    if not chat:
        return list(tokenizer("".join(m["content"] for m in messages), add_special_tokens=False).input_ids)
    marker = "\x00ASSISTANT\x00"
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}]
    rendered = tokenizer.apply_chat_template(base + messages, add_generation_prompt=True, tokenize=False)
    if rendered.count(marker) != 1:
        raise ValueError("the chat template does not render an assistant turn followed by a user turn; "
                         "observations cannot be appended token-in/token-out with it")
    tail = rendered[rendered.index(marker) + len(marker):]
    eos = tokenizer.eos_token or ""
    if after_eos and eos and tail.startswith(eos):
        tail = tail[len(eos):]
    return list(tokenizer(tail, add_special_tokens=False).input_ids)


# ---- an environment's own task ---------------------------------------------------------------------


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


# ---- one episode in play ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int  # model turns
    max_tokens: int  # response tokens of an episode, sampled and appended
    turn_tokens: int  # most tokens of one model turn (rollout.max_new_tokens)


class EpisodeRun:
    """One episode between the engine and its environment, whoever drives it (the rollout worker, in training
    and in evaluation): `model_turn` takes a turn as the engine sampled it and returns the tool call to run, if
    any; `tool_done` / `tool_failed` take its outcome. When neither ended the episode, `episode.next_input()` is
    the next turn's input and `turn_budget()` its token limit. `end` is set once it has ended, and
    `finish_reason` says how: "stop" (the environment ended it), "max_turns", "length" (no room for another
    token in env.max_episode_tokens) or "tool_error" (a tool timed out or crashed: `end.reason` says which)."""

    def __init__(self, env: Environment, prompt_ids: list[int], limits: EpisodeLimits,
                 observe: Callable[[str, bool], list[int]], decode: Callable[[list[int]], str], eos_ids: frozenset[int]) -> None:
        self.env, self.limits, self.observe, self.decode, self.eos_ids = env, limits, observe, decode, eos_ids
        self.episode = Episode(list(prompt_ids))
        self.pending: ToolCall | None = None
        self.end: EnvStep | None = None
        self.finish_reason: str | None = None
        self._closed = True  # the last model turn ended with an EOS

    @property
    def done(self) -> bool:
        return self.end is not None

    @property
    def stop(self) -> tuple[str, ...]:
        """The strings that end a model turn: the environment's."""
        return self.env.stop

    def turn_budget(self) -> int:
        return min(self.limits.turn_tokens, self.limits.max_tokens - len(self.episode.response_ids))

    def model_turn(self, ids: list[int], logprobs: list[float], versions: list[int]) -> ToolCall | None:
        """Append a model turn; returns the tool call the caller must run (then `tool_done`/`tool_failed`)."""
        text = self.decode(ids)
        call = self.env.tool_call(text)
        self.episode.add_model_turn(ids, logprobs, versions, call, text)
        self._closed = bool(ids) and ids[-1] in self.eos_ids
        if call is None:
            self._after(self.env.step(text))
        elif self.episode.model_turns() >= self.limits.max_turns:  # the model could never read its result: not run
            self._finish(EnvStep(done=True, reason=f"env.max_turns={self.limits.max_turns} reached"), "max_turns")
        elif call.name not in self.env.tools:  # answered at once: nothing to run
            self._after(self.env.tool_result(call, f"error: no tool {call.name!r} (tools: {', '.join(self.env.tools)})"), call.name)
        else:
            self.pending = call
        return self.pending

    def tool_done(self, result: str) -> None:
        call, self.pending = self.pending, None
        self._after(self.env.tool_result(call, result), call.name)

    def tool_failed(self, why: str) -> None:
        self.pending = None
        self._finish(EnvStep(done=True, reason=why), "tool_error")

    def _after(self, step: EnvStep, tool: str | None = None) -> None:
        if step.done:
            return self._finish(step, "stop")
        if self.episode.model_turns() >= self.limits.max_turns:
            return self._finish(EnvStep(done=True, reason=f"env.max_turns={self.limits.max_turns} reached"), "max_turns")
        ids = self.observe(step.observation, self._closed)
        if len(self.episode.response_ids) + len(ids) >= self.limits.max_tokens:  # no room left for a model token
            return self._finish(EnvStep(done=True, reason=f"env.max_episode_tokens={self.limits.max_tokens} used"), "length")
        self.episode.add_observation(ids, step.observation, tool)

    def _finish(self, step: EnvStep, finish_reason: str) -> None:
        self.end, self.finish_reason = step, finish_reason
