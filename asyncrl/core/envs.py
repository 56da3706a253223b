"""Multi-turn environments: the plugin API, tool calls, the registry, and the built-in environments.

An environment plays one episode with the model. The rollout worker owns the loop:

1. `env = make_environment(name)(prompt, seed)`; `env.start()` gives the first user message.
2. The engine samples a model turn (token in, token out: the engine is given the episode's exact tokens).
3. `env.tool_call(text)` parses a tool call from the turn. If there is one, the worker runs `env.tools[name]`
   on its argument in a separate process, off the engine loop, killed at its timeout, and `env.tool_result`
   turns the result into the next step. Otherwise `env.step(text)` answers the turn (a game's reply, or the
   final answer checked).
4. An `EnvStep` that is not done carries the observation; it is tokenised once (asyncrl.core.chat.observation_ids) and
   appended to the episode's tokens, and the next model turn continues from exactly those tokens
   (asyncrl.core.episode.EpisodeRun keeps that bookkeeping).

Tools are plain top-level functions `str -> str` (picklable by reference), so a slow or hung tool never holds
the environment's state or the engine. Environments are found like algorithms: a built-in name
(`ENVIRONMENTS`), or a dotted path to a subclass of `Environment`.
"""
from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass
from typing import Callable, ClassVar

from asyncrl.core.plugins import load_object
from asyncrl.core.prompts import Prompt
from asyncrl.core.rewards import final_number

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
