"""The OpenAI chat-completions protocol as the agents' endpoint speaks it: a request checked and parsed
(`parse_request`; what is refused, with which status, is docs/environments-and-agents.md's list), the request the
rollout loop answers (`ChatRequest`), and a reply's body (`completion_body`). Function calling's parts (tools,
tool calls, their rendering and parsing) are asyncrl.core.tool_calls."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ValidationError, field_validator, model_validator

from asyncrl.core.tool_calls import canonical_tool_calls, check_tool_choice, check_tools

ROLES = ("system", "user", "assistant", "tool", "developer")


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
    tools: list[dict] | None = None  # function tools (asyncrl.core.tool_calls.check_tools)
    tool_choice: str = "none"  # "auto" (tool calls are parsed from the reply) or "none"
    received: float = field(default_factory=time.monotonic)
    body: dict | None = None  # the answer
    error: ChatRequestError | None = None
    done: threading.Event = field(default_factory=threading.Event)
    on_done: Callable[[], None] | None = field(default=None, repr=False, compare=False)  # the endpoint's wake-up, called from the loop's thread

    def answer(self, body: dict) -> None:
        self.body = body
        self._settle()

    def fail(self, status: int, message: str) -> None:
        self.error = ChatRequestError(status, message)
        self._settle()

    def _settle(self) -> None:
        self.done.set()
        if self.on_done is not None:
            self.on_done()


class ChatBody(BaseModel):
    """The fields of a chat-completions body that the endpoint reads (others are ignored), checked in this order
    after the episode's name: stream, n, functions, tools, tool_choice, max_tokens, messages, stop. A check that
    fails raises ChatRequestError, which pydantic wraps in its ValidationError (parse_request unwraps it)."""

    max_tokens: int | None = None
    logprobs: bool = False
    messages: list[dict[str, Any]]
    stop: tuple[str, ...] = ()
    tools: list[dict] | None = None
    tool_choice: str = "none"

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, body: dict) -> dict:
        """Refuse what the endpoint does not do; `max_completion_tokens` stands for `max_tokens` when given."""
        if body.get("stream"):
            raise ChatRequestError(400, "stream=true is not supported: each reply is recorded whole")
        if body.get("n", 1) != 1:
            raise ChatRequestError(400, f"n={body.get('n')} is not supported: one reply per request (the run's group_size gives the samples)")
        if body.get("functions") or body.get("function_call"):
            raise ChatRequestError(400, "the deprecated `functions` API is not supported: pass `tools`")
        try:
            tools = check_tools(body.get("tools"))
            tool_choice = check_tool_choice(body.get("tool_choice"), tools)
        except ValueError as exc:
            raise ChatRequestError(400, str(exc)) from None
        return {"max_tokens": body.get("max_completion_tokens", body.get("max_tokens")), "logprobs": bool(body.get("logprobs")),
                "messages": body.get("messages"), "stop": body.get("stop"), "tools": tools,
                "tool_choice": tool_choice}

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _positive(cls, max_tokens: Any) -> Any:
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ChatRequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
        return max_tokens

    @field_validator("messages", mode="before")
    @classmethod
    def _messages(cls, messages: Any) -> list[dict]:
        return normalise_messages(messages)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, stop: Any) -> tuple[str, ...]:
        return stop_strings(stop)


def parse_request(payload: bytes, header_episode: str | None, path_episode: str | None = None) -> ChatRequest:
    """A chat-completions body as a ChatRequest, or ChatRequestError(400) naming what is wrong with it. The episode is
    the one the URL names (`/episodes/<id>/v1/...`: an agent that knows nothing of asyncrl), else the X-Episode-Id
    header's, else the body's `user`."""
    try:
        body = json.loads(payload or b"{}")
    except ValueError as exc:  # not JSON, or not UTF-8
        raise ChatRequestError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ChatRequestError(400, "the body must be a JSON object")
    episode_id = path_episode or header_episode or body.get("user")
    if not isinstance(episode_id, str) or not episode_id:
        raise ChatRequestError(400, "name the episode: use the task's base_url (it names the episode), or pass the task's "
                                    "episode_id as `user` or in an X-Episode-Id header")
    try:
        checked = ChatBody.model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc) from None
    return ChatRequest(episode_id, checked.messages, checked.max_tokens, checked.logprobs, checked.stop, checked.tools, checked.tool_choice)


def _refusal(exc: ValidationError) -> ChatRequestError:
    """The ChatRequestError of ChatBody's first failed check (pydantic wraps it), or a 400 in pydantic's words."""
    first = exc.errors()[0]
    cause = first.get("ctx", {}).get("error")
    return cause if isinstance(cause, ChatRequestError) else ChatRequestError(400, f"{'.'.join(map(str, first['loc']))}: {first['msg']}")


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
    """`messages` in one canonical form, so that a conversation sent back compares equal to what was answered:
    {"role", "content": str}, text parts of a content list joined, plus an assistant's non-empty `tool_calls` (its
    content may then be null, read as "") and a tool result's `tool_call_id`; other fields are dropped; anything
    else is a 400."""
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError(400, "messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ChatRequestError(400, f"messages[{i}] needs a role of {', '.join(ROLES)}")
        content, calls = m.get("content"), m.get("tool_calls") if m["role"] == "assistant" else None
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ChatRequestError(400, f"messages[{i}]: only text content parts are supported")
            content = "".join(p.get("text", "") for p in content)
        if content is None and calls:
            content = ""
        if not isinstance(content, str):
            raise ChatRequestError(400, f"messages[{i}].content must be a string")
        message = {"role": m["role"], "content": content}
        if calls:
            try:
                message["tool_calls"] = canonical_tool_calls(calls, f"messages[{i}]")
            except ValueError as exc:
                raise ChatRequestError(400, str(exc)) from None
        if m["role"] == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise ChatRequestError(400, f"messages[{i}] (tool) needs the tool_call_id of the call it answers")
            message["tool_call_id"] = m["tool_call_id"]
        out.append(message)
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


def completion_body(episode_id: str, turn: int, message: dict, ids: list[int], logprobs: list[float], versions: list[int],
                    finish: str, prompt_tokens: int, token_strings: list[str] | None) -> dict:
    """An OpenAI chat.completion object for one model turn (`message`: the canonical assistant message, its content
    null when it holds tool calls only), with the tokens and versions under `asyncrl`."""
    message = {**message, "content": message["content"] or None} if message.get("tool_calls") else message
    choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
    if token_strings is not None:
        choice["logprobs"] = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                          for t, lp in zip(token_strings, logprobs)]}
    return {
        "id": f"chatcmpl-{episode_id}-{turn}", "object": "chat.completion", "created": int(time.time()), "model": "policy",
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "total_tokens": prompt_tokens + len(ids)},
        "asyncrl": {"episode_id": episode_id, "token_ids": ids, "token_versions": versions},
    }
