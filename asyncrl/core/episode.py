"""An episode in play: its tokens (`Episode`, `Turn`), its limits, and the drivers the rollout loop advances.

Every sample is an episode: a single-turn one (`SingleTurn`) ends with its first model turn and is scored by the
task's reward; an environment's (`EpisodeRun`) alternates model turns with tool calls and observations until the
environment ends it; a black-box agent's (asyncrl.core.agents.AgentRun) waits for its agent's requests. All three
are an `EpisodeDriver`, so the loop never asks which kind it holds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from asyncrl.core.envs import Environment, EnvStep, ToolCall


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


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int  # model turns
    max_tokens: int  # response tokens of an episode, sampled and appended
    turn_tokens: int  # most tokens of one model turn (rollout.max_new_tokens)


class EpisodeDriver(Protocol):
    """What the rollout loop holds per sample, whatever plays it. The loop submits `episode.next_input()` with
    `turn_budget()` tokens and the `stop` strings, hands the sampled turn to `model_turn` (which returns a tool
    call to run, or None), and a call's outcome to `tool_done` / `tool_failed`. Once `done`, `finish_reason`
    says how it ended and the episode's tokens are the sample's; `multi_turn` says whether the record carries
    the turns (loss mask, turns, episode end) and `own_reward` whether `end.reward` is its reward (else the
    task's reward scores the response)."""

    episode: Episode
    pending: ToolCall | None
    end: EnvStep | None
    finish_reason: str | None
    multi_turn: bool
    own_reward: bool

    @property
    def done(self) -> bool: ...

    @property
    def stop(self) -> tuple[str, ...]: ...

    def turn_budget(self) -> int: ...

    def model_turn(self, ids: list[int], logprobs: list[float], versions: list[int], finish_reason: str) -> ToolCall | None: ...

    def tool_done(self, result) -> None: ...

    def tool_failed(self, why: str) -> None: ...

    def interrupted(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None: ...


class SingleTurn:
    """A single-turn sample: an episode of one model turn, which ends it with the engine's finish reason ("stop",
    "length"); the task's reward scores it. `interrupted` (the run stopped mid-turn) keeps what the turn had
    sampled, with finish reason "abort", so the record shows it."""

    pending: ToolCall | None = None
    end: EnvStep | None = None
    finish_reason: str | None = None
    multi_turn = False
    own_reward = False

    def __init__(self, prompt_ids: list[int], turn_tokens: int, stop: tuple[str, ...] = ()) -> None:
        self.episode = Episode(list(prompt_ids))
        self.turn_tokens, self._stop = turn_tokens, stop

    @property
    def done(self) -> bool:
        return self.end is not None

    @property
    def stop(self) -> tuple[str, ...]:
        return self._stop

    def turn_budget(self) -> int:
        return self.turn_tokens

    def model_turn(self, ids: list[int], logprobs: list[float], versions: list[int], finish_reason: str) -> None:
        self.episode.add_model_turn(ids, logprobs, versions)
        self.end, self.finish_reason = EnvStep(done=True), finish_reason

    def tool_done(self, result) -> None:
        raise RuntimeError("a single-turn sample calls no tools")

    def tool_failed(self, why: str) -> None:
        raise RuntimeError("a single-turn sample calls no tools")

    def interrupted(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        self.model_turn(ids, logprobs, versions, "abort")


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

    multi_turn = True
    own_reward = True

    def model_turn(self, ids: list[int], logprobs: list[float], versions: list[int], finish_reason: str = "") -> ToolCall | None:
        """Append a model turn; returns the tool call the caller must run (then `tool_done`/`tool_failed`). The
        turn's own finish reason does not end the episode: the environment and the limits do."""
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

    def interrupted(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        """The run stopped mid-turn: the record keeps the whole turns only (an environment never saw this one)."""

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
