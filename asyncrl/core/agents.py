"""Black-box agents trained through an OpenAI-compatible chat endpoint (`env.agent`).

A user's agent program is a function `agent(task: dict) -> float`. The rollout worker runs it once per episode
in a tool process (asyncrl.core.tools: killed past `env.agent_timeout_s`), with

    task = {"prompt": ..., "answer": ..., "prompt_id": ..., "episode_id": ...,
            "base_url": "http://127.0.0.1:PORT/episodes/<episode_id>/v1"}

and it talks to the policy as to any OpenAI server, function calling included:

    client = openai.OpenAI(base_url=task["base_url"], api_key="asyncrl")
    reply = client.chat.completions.create(model="policy", messages=messages, tools=tools)

then returns the episode's reward. The endpoint (asyncrl.core.agent_endpoint.Endpoint: FastAPI on uvicorn,
127.0.0.1 only, a free port unless `env.endpoint_port`) serves `POST /v1/chat/completions` and `GET /v1/models`
while the worker runs; it is off unless `env.agent` is set. Every request is recorded token in / token out into
the episode it names: by its base URL (each episode has its own), else an `X-Episode-Id` header or `user`:

- the first request's messages are rendered by the chat template into the episode's prompt;
- a later request must repeat the conversation so far (each assistant message as it was answered) and add
  messages after it. Only the added messages are tokenised, as an environment's observation is
  (asyncrl.core.chat.observation_ids): masked out of the loss, version -1. The stored tokens of earlier turns
  are reused, never re-tokenised, so what the learner trains on is exactly what the engine sampled;
- each reply is one model turn: the engine's sampled tokens with their behaviour log-probs and versions
  (returned too when `logprobs=true`, and as `asyncrl.token_ids` / `asyncrl.token_versions`);
- with `tools`, the first request renders them into the prompt (the chat template's own format, else the Hermes
  fallback: asyncrl.core.tool_calls), each reply is parsed by vLLM's `env.tool_parser` into `tool_calls`
  (`finish_reason: "tool_calls"`; text that does not parse stays text), and `role: "tool"` results come back as
  added messages like any other. The assistant message sent back is compared in canonical form with the one
  answered, so an SDK's echo of a tool call is accepted and its tokens stay the sampled ones.

Sampling is the run's (`rollout.temperature`, `top_p`): a request's own temperature is ignored, so the
behaviour log-probs are those of the distribution being trained. `max_tokens` (or `max_completion_tokens`)
lowers a turn's limit below `rollout.max_new_tokens`. The episode ends when the agent returns: its reward is the
one returned. It ends early, with reward 0, at `env.max_turns` or `env.max_episode_tokens` (the request that
would pass them is answered 400); an agent that raises, times out, rewrites the conversation or never asks
anything drops its group as dropped_error, with the reason. `stop` (a string or up to 4) ends the turn at the first
one sampled, as an environment's stop strings do: the reply is the decoded sampled tokens, so it keeps the stop string
(and the rest of the token that completed it), unlike OpenAI's, and the agent sends it back as answered. Streaming,
`n` > 1, a forced `tool_choice` ("required" or a named function) and the deprecated `functions` are refused with a
400 that says so. The held-out evaluation plays the agent the same way, greedily (RolloutWorker.episodes).
"""
from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.chat import AgentCodec
from asyncrl.core.chat_api import ChatRequest, ChatRequestError, completion_body, divergence
from asyncrl.core.envs import Environment, EnvStep, ToolCall
from asyncrl.core.episode import Episode, EpisodeLimits

AWAIT = ToolCall("agent", "")
"""What an agent episode waits for between two turns (a ToolCall, so the worker's loop treats it as a tool)."""


class AgentEnvironment(Environment):
    """Stands for a black-box agent where the worker needs an environment: the group's prompt is the task's text."""

    name = "agent"

    def start(self) -> str:
        return self.prompt.text


@dataclass(frozen=True)
class AgentEnd:
    """The agent returned: its episode's reward."""

    reward: float


class AgentRun:
    """One agent episode, an asyncrl.core.episode.EpisodeDriver: between two turns it waits for its agent (`pending`
    is AWAIT), whose next request or return comes in through `tool_done`; its reward is what the agent returned."""

    def __init__(self, episode_id: str, limits: EpisodeLimits, codec: AgentCodec, eos_ids: frozenset[int], max_prompt: int) -> None:
        self.episode_id, self.limits, self.codec, self.eos_ids, self.max_prompt = episode_id, limits, codec, eos_ids, max_prompt
        self.episode = Episode([])
        self.messages: list[dict] = []  # the conversation so far, as the agent sent it and was answered (canonical)
        self.tools: list[dict] | None = None  # the first request's, rendered into the prompt
        self.request: ChatRequest | None = None  # the one being answered
        self.pending: ToolCall | None = AWAIT  # its first request
        self.end: EnvStep | None = None
        self.finish_reason: str | None = None
        self._closed = True

    @property
    def done(self) -> bool:
        return self.end is not None

    @property
    def stop(self) -> tuple[str, ...]:
        """The stop strings of the request being answered (its `stop`)."""
        return self.request.stop if self.request is not None else ()

    def turn_budget(self) -> int:
        asked = self.request.max_tokens if self.request is not None and self.request.max_tokens else self.limits.turn_tokens
        return min(self.limits.turn_tokens, asked, self.limits.max_tokens - len(self.episode.response_ids))

    multi_turn = True
    own_reward = True

    def model_turn(self, ids: list[int], logprobs: list[float], versions: list[int], finish_reason: str = "") -> ToolCall:
        """Append the sampled turn and answer the request with it (its tool calls parsed when the request allows
        them); then wait for the agent again."""
        budget = self.turn_budget()
        text = self.codec.decode(ids)
        self.episode.add_model_turn(ids, logprobs, versions, None, text)
        self._closed = bool(ids) and ids[-1] in self.eos_ids
        request, self.request = self.request, None
        content, calls = self.codec.parse(text, request.tools) if request.tools and request.tool_choice == "auto" else (text, [])
        message = {"role": "assistant", "content": content or "", **({"tool_calls": calls} if calls else {})}
        self.messages.append(message)
        finish = "tool_calls" if calls else "stop" if self._closed or len(ids) < budget else "length"
        request.answer(completion_body(self.episode_id, self.episode.model_turns(), message, ids, logprobs, versions, finish,
                                       len(self.episode.next_input()) - len(ids), self.codec.tokens(ids) if request.logprobs else None))
        self.pending = AWAIT
        return AWAIT

    def interrupted(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        """The run stopped mid-turn: the record keeps the whole turns only (the agent never got this one)."""

    def tool_done(self, event: ChatRequest | AgentEnd) -> None:
        """The agent's next request (the next turn is due unless it ended the episode) or its return."""
        self.pending = None
        if isinstance(event, AgentEnd):
            if not self.episode.turns:
                return self._finish(EnvStep(done=True, reason="the agent returned without asking the model anything"), "tool_error")
            return self._finish(EnvStep(done=True, reward=event.reward, reason="the agent returned"), "stop")
        try:
            self._take(event)
        except ChatRequestError as exc:
            event.fail(exc.status, f"episode {self.episode_id!r}: {exc}")

    def _take(self, request: ChatRequest) -> None:
        if not self.messages:  # the first request: its messages and tools are the prompt
            self.tools = request.tools
            ids = self.codec.prompt_ids(request.messages, request.tools)
            if len(ids) > self.max_prompt:
                self._finish(EnvStep(done=True, reason=f"the first request encodes to {len(ids)} tokens, more than {self.max_prompt}"), "tool_error")
                raise ChatRequestError(400, self.end.reason + " (model.max_model_len - env.max_episode_tokens)")
            self.episode.prompt_ids = ids
        else:
            why = divergence(self.messages, request.messages)
            if why is None and request.tools != self.tools:
                why = "its tools differ from the first request's (they were rendered into the episode's prompt)"
            if why is not None:
                self._finish(EnvStep(done=True, reason=f"a request does not continue its episode: {why}"), "tool_error")
                raise ChatRequestError(400, f"{why}; a request must repeat the conversation so far and add to it")
            if self.episode.model_turns() >= self.limits.max_turns:
                self._finish(EnvStep(done=True, reason=f"env.max_turns={self.limits.max_turns} reached"), "max_turns")
                raise ChatRequestError(400, self.end.reason)
            added = request.messages[len(self.messages):]
            ids = self.codec.delta_ids(added, self._closed)
            if len(self.episode.response_ids) + len(ids) >= self.limits.max_tokens:  # no room left for a model token
                self._finish(EnvStep(done=True, reason=f"env.max_episode_tokens={self.limits.max_tokens} used"), "length")
                raise ChatRequestError(400, self.end.reason)
            self.episode.add_observation(ids, "\n".join(m["content"] for m in added), added[-1]["role"])
        self.messages = list(request.messages)
        self.request = request

    def tool_failed(self, why: str) -> None:
        """The agent raised, timed out or died: the episode ends and drops its group."""
        self.pending = None
        if self.request is not None:
            self.request.fail(500, why)
            self.request = None
        self._finish(EnvStep(done=True, reason=why), "tool_error")

    def _finish(self, step: EnvStep, finish_reason: str) -> None:
        self.end, self.finish_reason = step, finish_reason
