"""Black-box agents trained through an OpenAI-compatible chat endpoint (`env.agent`, issue 18).

A user's agent program is a function `agent(task: dict) -> float`. The rollout worker runs it once per episode
in a tool process (asyncrl.core.tools: killed past `env.agent_timeout_s`), with

    task = {"prompt": ..., "answer": ..., "prompt_id": ..., "episode_id": ..., "base_url": "http://127.0.0.1:PORT/v1"}

and it talks to the policy as to any OpenAI server:

    client = openai.OpenAI(base_url=task["base_url"], api_key="asyncrl")
    reply = client.chat.completions.create(model="policy", messages=messages, user=task["episode_id"])

then returns the episode's reward. The endpoint (`Endpoint`: 127.0.0.1 only, a free port unless
`env.endpoint_port`) serves `POST /v1/chat/completions` and `GET /v1/models` while the worker runs; it is off
unless `env.agent` is set. Every request is recorded token in / token out into the episode its id names (the
`user` field, or an `X-Episode-Id` header):

- the first request's messages are rendered by the chat template into the episode's prompt;
- a later request must repeat the conversation so far (each assistant message as it was answered) and add
  messages after it. Only the added messages are tokenised, as an environment's observation is
  (asyncrl.core.envs.observation_ids): masked out of the loss, version -1. The stored tokens of earlier turns
  are reused, never re-tokenised, so what the learner trains on is exactly what the engine sampled;
- each reply is one model turn: the engine's sampled tokens with their behaviour log-probs and versions
  (returned too when `logprobs=true`, and as `asyncrl.token_ids` / `asyncrl.token_versions`).

Sampling is the run's (`rollout.temperature`, `top_p`): a request's own temperature is ignored, so the
behaviour log-probs are those of the distribution being trained. `max_tokens` (or `max_completion_tokens`)
lowers a turn's limit below `rollout.max_new_tokens`. The episode ends when the agent returns: its reward is the
one returned. It ends early, with reward 0, at `env.max_turns` or `env.max_episode_tokens` (the request that
would pass them is answered 400); an agent that raises, times out, rewrites the conversation or never asks
anything drops its group as dropped_error, with the reason. `stop` (a string or up to 4) ends the turn at the first
one sampled, as an environment's stop strings do: the reply is the decoded sampled tokens, so it keeps the stop string
(and the rest of the token that completed it), unlike OpenAI's, and the agent sends it back as answered. Streaming,
`n` > 1 and the API's `tools` are refused with a 400 that says so (write tool calls in the text). The held-out evaluation plays the agent the same way,
greedily (RolloutWorker.episodes).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from asyncrl.core.envs import Environment, EnvStep, Episode, EpisodeLimits, ToolCall
from asyncrl.core.tools import ToolOutcome, ToolPool

ROLES = ("system", "user", "assistant", "tool", "developer")
AWAIT = ToolCall("agent", "")
"""What an agent episode waits for between two turns (a ToolCall, so the worker's loop treats it as a tool)."""


class AgentEnvironment(Environment):
    """Stands for a black-box agent where the worker needs an environment: the group's prompt is the task's text."""

    name = "agent"

    def start(self) -> str:
        return self.prompt.text


class ChatRequestError(ValueError):
    """A request the endpoint refuses; `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ChatRequest:
    """One chat-completions request, between the server thread that waits on it and the loop that answers it."""

    episode_id: str
    messages: list[dict]
    max_tokens: int | None = None
    logprobs: bool = False
    stop: tuple[str, ...] = ()
    received: float = field(default_factory=time.monotonic)
    body: dict | None = None  # the answer
    error: ChatRequestError | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def answer(self, body: dict) -> None:
        self.body = body
        self.done.set()

    def fail(self, status: int, message: str) -> None:
        self.error = ChatRequestError(status, message)
        self.done.set()


@dataclass(frozen=True)
class AgentEnd:
    """The agent returned: its episode's reward."""

    reward: float


def parse_request(payload: bytes, header_episode: str | None) -> ChatRequest:
    """A chat-completions body as a ChatRequest, or ChatRequestError(400) naming what is wrong with it."""
    try:
        body = json.loads(payload or b"{}")
    except json.JSONDecodeError as exc:
        raise ChatRequestError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ChatRequestError(400, "the body must be a JSON object")
    episode_id = header_episode or body.get("user")
    if not isinstance(episode_id, str) or not episode_id:
        raise ChatRequestError(400, "name the episode: pass the task's episode_id as `user` (or an X-Episode-Id header)")
    if body.get("stream"):
        raise ChatRequestError(400, "stream=true is not supported: each reply is recorded whole")
    if body.get("n", 1) != 1:
        raise ChatRequestError(400, f"n={body.get('n')} is not supported: one reply per request (the run's group_size gives the samples)")
    if body.get("tools") or body.get("functions"):
        raise ChatRequestError(400, "the API's tools are not supported: write tool calls in the text and send results as messages")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ChatRequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
    return ChatRequest(episode_id, normalise_messages(body.get("messages")), max_tokens, bool(body.get("logprobs")), stop_strings(body.get("stop")))


MAX_STOP = 4
"""As OpenAI's API: at most 4 stop strings per request."""


def stop_strings(stop) -> tuple[str, ...]:
    """A request's `stop` (null, a string or a list of strings) as a tuple, or ChatRequestError(400) naming the problem."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ChatRequestError(400, f"stop must be a non-empty string or a list of them, got {stop!r}")
    if len(stop) > MAX_STOP:
        raise ChatRequestError(400, f"stop has {len(stop)} strings, at most {MAX_STOP} are allowed")
    return tuple(dict.fromkeys(stop))


def normalise_messages(messages) -> list[dict]:
    """`messages` as [{"role", "content": str}]: text parts of a content list are joined; anything else is a 400."""
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError(400, "messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ChatRequestError(400, f"messages[{i}] needs a role of {', '.join(ROLES)}")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ChatRequestError(400, f"messages[{i}]: only text content parts are supported")
            content = "".join(p.get("text", "") for p in content)
        if not isinstance(content, str):
            raise ChatRequestError(400, f"messages[{i}].content must be a string")
        out.append({"role": m["role"], "content": content})
    return out


def divergence(known: list[dict], messages: list[dict]) -> str | None:
    """Why `messages` does not continue the conversation `known` (None when it does, with at least one new message)."""
    for i, m in enumerate(known):
        if i >= len(messages):
            return f"it has {len(messages)} messages, the episode's conversation so far has {len(known)}"
        if messages[i] != m:
            what = "the assistant's reply as it was answered" if m["role"] == "assistant" else "the message sent before"
            return f"messages[{i}] ({messages[i]['role']}) differs from {what}"
    if len(messages) == len(known):
        return "it adds no message after the conversation so far"
    return None


class AgentRun:
    """One agent episode, driven by the worker's loop as an asyncrl.core.envs.EpisodeRun is (`episode`, `pending`,
    `done`, `end`, `finish_reason`, `turn_budget`, `model_turn`, `tool_done`, `tool_failed`): between two turns
    it waits for its agent (`pending` is AWAIT), whose next request or return comes in through `tool_done`."""

    def __init__(self, episode_id: str, limits: EpisodeLimits, render_prompt: Callable[[list[dict]], list[int]],
                 render_delta: Callable[[list[dict], bool], list[int]], decode: Callable[[list[int]], str],
                 tokens: Callable[[list[int]], list[str]], eos_ids: frozenset[int], max_prompt: int) -> None:
        self.episode_id, self.limits, self.eos_ids, self.max_prompt = episode_id, limits, eos_ids, max_prompt
        self.render_prompt, self.render_delta, self.decode, self.tokens = render_prompt, render_delta, decode, tokens
        self.episode = Episode([])
        self.messages: list[dict] = []  # the conversation so far, as the agent sent it and was answered
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

    def model_turn(self, ids: list[int], logprobs: list[float], versions: list[int]) -> ToolCall:
        """Append the sampled turn and answer the request with it; then wait for the agent again."""
        budget = self.turn_budget()
        text = self.decode(ids)
        self.episode.add_model_turn(ids, logprobs, versions, None, text)
        self._closed = bool(ids) and ids[-1] in self.eos_ids
        self.messages.append({"role": "assistant", "content": text})
        request, self.request = self.request, None
        finish = "stop" if self._closed or len(ids) < budget else "length"
        request.answer(completion_body(self.episode_id, self.episode.model_turns(), text, ids, logprobs, versions, finish,
                                       len(self.episode.next_input()) - len(ids), self.tokens(ids) if request.logprobs else None))
        self.pending = AWAIT
        return AWAIT

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
        if not self.messages:  # the first request: its messages are the prompt
            ids = self.render_prompt(request.messages)
            if len(ids) > self.max_prompt:
                self._finish(EnvStep(done=True, reason=f"the first request encodes to {len(ids)} tokens, more than {self.max_prompt}"), "tool_error")
                raise ChatRequestError(400, self.end.reason + " (model.max_model_len - env.max_episode_tokens)")
            self.episode.prompt_ids = ids
        else:
            why = divergence(self.messages, request.messages)
            if why is not None:
                self._finish(EnvStep(done=True, reason=f"a request does not continue its episode: {why}"), "tool_error")
                raise ChatRequestError(400, f"{why}; a request must repeat the conversation so far and add to it")
            if self.episode.model_turns() >= self.limits.max_turns:
                self._finish(EnvStep(done=True, reason=f"env.max_turns={self.limits.max_turns} reached"), "max_turns")
                raise ChatRequestError(400, self.end.reason)
            added = request.messages[len(self.messages):]
            ids = self.render_delta(added, self._closed)
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


def completion_body(episode_id: str, turn: int, text: str, ids: list[int], logprobs: list[float], versions: list[int],
                    finish: str, prompt_tokens: int, token_strings: list[str] | None) -> dict:
    """An OpenAI chat.completion object for one model turn, with the tokens and versions under `asyncrl`."""
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish, "logprobs": None}
    if token_strings is not None:
        choice["logprobs"] = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                          for t, lp in zip(token_strings, logprobs)]}
    return {
        "id": f"chatcmpl-{episode_id}-{turn}", "object": "chat.completion", "created": int(time.time()), "model": "policy",
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "total_tokens": prompt_tokens + len(ids)},
        "asyncrl": {"episode_id": episode_id, "token_ids": ids, "token_versions": versions},
    }


# ---- the endpoint and the agents' processes ---------------------------------------------------------


class Endpoint:
    """The HTTP server (its own threads): each request is checked, queued for the loop and waited for."""

    def __init__(self, port: int, known: Callable[[str], bool], wait_s: float) -> None:
        self.requests: list[ChatRequest] = []
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the run's metrics count the requests
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "asyncrl"}]})
                self._send(404, _error(f"no route {self.path}: POST /v1/chat/completions, GET /v1/models"))

            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, _error(f"no route {self.path}: POST /v1/chat/completions"))
                payload = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    request = parse_request(payload, self.headers.get("X-Episode-Id"))
                    if not known(request.episode_id):
                        raise ChatRequestError(404, f"no episode {request.episode_id!r} is running on this worker (pass the task's episode_id)")
                except ChatRequestError as exc:
                    return self._send(exc.status, _error(str(exc)))
                with endpoint.lock:
                    endpoint.requests.append(request)
                if not request.done.wait(wait_s):
                    return self._send(504, _error(f"no reply within {wait_s:g} s (env.agent_timeout_s)"))
                if request.error is not None:
                    return self._send(request.error.status, _error(str(request.error)))
                self._send(200, request.body)

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="asyncrl-endpoint", daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def take(self) -> list[ChatRequest]:
        with self.lock:
            taken, self.requests = self.requests, []
        return taken

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error"}}


class AgentHost:
    """A rollout worker's agents, seen by its loop as a ToolPool is (`submit`, `poll`, `pending`, `pids`, `close`):
    `start` runs an episode's agent in a tool process; `submit` after a model turn says the episode waits for its
    agent; `poll` hands each waiting episode its agent's next event (a ChatRequest, an AgentEnd, or an error)."""

    def __init__(self, agent: str, size: int, timeout_s: float, port: int) -> None:
        self.agent = agent
        self.pool = ToolPool("agent", size, timeout_s, agent=agent, timeout_key="env.agent_timeout_s")
        self.keys: dict[str, object] = {}  # episode id -> the loop's key for it, while its agent runs
        self.episodes: dict[object, str] = {}  # the other way round
        self.awaiting: dict[object, float] = {}  # key -> since when it waits for its agent
        self.held: dict[object, list[ToolOutcome]] = {}  # events for an episode that is not waiting (yet)
        self.endpoint = Endpoint(port, lambda episode_id: episode_id in self.keys, timeout_s)
        self.base_url = self.endpoint.base_url

    def start(self, key: object, episode_id: str, prompt) -> None:
        self.keys[episode_id], self.episodes[key] = key, episode_id
        self.awaiting[key] = time.monotonic()
        task = {"prompt": prompt.text, "answer": prompt.answer, "prompt_id": prompt.prompt_id, "episode_id": episode_id,
                "base_url": self.base_url}
        self.pool.submit(key, "agent", json.dumps(task))

    def submit(self, key: object, name: str, argument: str) -> None:
        self.awaiting[key] = time.monotonic()

    def pending(self) -> int:
        """Agents running or queued (an update with drain waits for them)."""
        return self.pool.pending()

    def poll(self) -> list[ToolOutcome]:
        for outcome in self.pool.poll():  # agents that returned, raised, died or timed out
            episode_id = self.episodes.pop(outcome.key, None)
            if episode_id is not None:  # not forgotten
                del self.keys[episode_id]
                self.held.setdefault(outcome.key, []).append(self._ended(outcome))
        for request in self.endpoint.take():
            key = self.keys.get(request.episode_id)
            if key is None:
                request.fail(404, f"episode {request.episode_id!r} has ended")
                continue
            self.held.setdefault(key, []).append(ToolOutcome(key, request, None, 0.0))
        ready = []
        for key in [k for k in self.held if k in self.awaiting]:
            event = self.held[key].pop(0)
            if not self.held[key]:
                del self.held[key]
            ready.append(ToolOutcome(key, event.result, event.error, time.monotonic() - self.awaiting.pop(key)))
        return ready

    def _ended(self, outcome: ToolOutcome) -> ToolOutcome:
        if outcome.error is not None:
            return ToolOutcome(outcome.key, None, f"agent {self.agent}: {outcome.error}", outcome.seconds)
        try:
            return ToolOutcome(outcome.key, AgentEnd(float(outcome.result)), None, outcome.seconds)
        except ValueError:
            return ToolOutcome(outcome.key, None, f"agent {self.agent} did not return a reward: {outcome.result}", outcome.seconds)

    def forget(self, key: object, why: str) -> None:
        """An episode that ended before its agent returned: its agent's later requests are answered 404 with `why`."""
        self.awaiting.pop(key, None)
        episode_id = self.episodes.pop(key, None)
        self.keys.pop(episode_id, None)
        for event in self.held.pop(key, []):
            if isinstance(event.result, ChatRequest):
                event.result.fail(404, f"episode {episode_id!r} has ended: {why}")

    def pids(self) -> list[int]:
        return self.pool.pids()

    def reset(self) -> None:
        """The run stopped: every agent still running is killed and its requests are answered 503."""
        for request in self.endpoint.take() + [e.result for events in self.held.values() for e in events if isinstance(e.result, ChatRequest)]:
            request.fail(503, "the run stopped")
        self.keys, self.episodes, self.awaiting, self.held = {}, {}, {}, {}
        self.pool.close()
        self.pool = ToolPool("agent", self.pool.size, self.pool.timeout_s, agent=self.agent, timeout_key="env.agent_timeout_s")

    def close(self) -> None:
        self.reset()
        self.pool.close()
        self.endpoint.close()
