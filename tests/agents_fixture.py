"""Agents for tests/test_agents.py: programs that call the policy with the `openai` client, as a user's agent would.

Each writes what it was answered (the client's parsed objects, dumped) and the errors it met to
$ASYNCRL_AGENT_LOG/<episode_id>.json, for the test to check against the trajectory store."""
from __future__ import annotations

import json
import os
from pathlib import Path

import openai

QUESTION = "Reply with one short word."
STOP = [" ", "."]
"""The second request's stop strings: a turn of a few tokens of English meets one."""


def _client(task: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=task["base_url"], api_key="asyncrl", max_retries=0, timeout=60)


def _log(task: dict, entry: dict) -> None:
    (Path(os.environ["ASYNCRL_AGENT_LOG"]) / f"{task['episode_id']}.json").write_text(json.dumps(entry))


def two_turns(task: dict) -> float:
    """Ask, then follow up on the reply; the reward is 1 when the second reply is longer than the first."""
    client = _client(task)
    messages = [{"role": "system", "content": QUESTION}, {"role": "user", "content": task["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages, user=task["episode_id"], logprobs=True, max_tokens=6)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "And then?"}]
    second = client.chat.completions.create(model="policy", messages=messages, user=task["episode_id"], logprobs=True, stop=STOP)
    _log(task, {"messages": messages, "replies": [first.model_dump(), second.model_dump()]})
    return float(len(second.choices[0].message.content) > len(first.choices[0].message.content))


def misbehaving(task: dict) -> float:
    """Requests the endpoint must refuse with a clear error, then a conversation it rewrites (which ends the episode).
    The unnamed and unknown episodes are asked at the endpoint's root (the task's base_url names the episode)."""
    client, errors = _client(task), {}
    root = openai.OpenAI(base_url=task["base_url"].split("/episodes/")[0] + "/v1", api_key="asyncrl", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": task["prompt"]}]
    for name, kwargs in (("unknown_episode", {"user": "no-such-episode"}), ("no_episode", {}),
                         ("stream", {"user": task["episode_id"], "stream": True}),
                         ("tools", {"user": task["episode_id"], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]})):
        try:
            (client if kwargs.get("user") == task["episode_id"] else root).chat.completions.create(model="policy", messages=messages, **kwargs)
        except openai.APIStatusError as exc:
            errors[name] = [exc.status_code, exc.body["message"] if isinstance(exc.body, dict) else str(exc.body)]
    first = client.chat.completions.create(model="policy", messages=messages, user=task["episode_id"], max_tokens=4)
    rewritten = messages + [{"role": "assistant", "content": first.choices[0].message.content + " (edited)"}, {"role": "user", "content": "ok"}]
    try:
        client.chat.completions.create(model="policy", messages=rewritten, user=task["episode_id"])
    except openai.APIStatusError as exc:
        errors["rewritten"] = [exc.status_code, exc.body["message"] if isinstance(exc.body, dict) else str(exc.body)]
    _log(task, {"errors": errors})
    return 1.0


CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time now.", "parameters": {"type": "object", "properties": {}}}}


def function_calling(task: dict) -> float:
    """An agent that knows only its base URL (no episode id) and passes `tools`: it sends back each reply as the
    SDK parsed it, the results of any tool calls as `role: "tool"` messages (else a follow-up question), and asks again."""
    client = openai.OpenAI(base_url=task["base_url"], api_key="none", max_retries=0, timeout=60)
    messages: list = [{"role": "user", "content": task["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[CLOCK], max_tokens=6)
    message = first.choices[0].message
    messages.append(message)
    added = ([{"role": "tool", "tool_call_id": call.id, "content": "12:00"} for call in message.tool_calls] if message.tool_calls
             else [{"role": "user", "content": "And then?"}])
    messages += added
    second = client.chat.completions.create(model="policy", messages=messages, tools=[CLOCK], max_tokens=6)
    _log(task, {"added": added, "replies": [first.model_dump(), second.model_dump()]})
    return 1.0


def by_group(task: dict) -> float:
    """`misbehaving` in the training run's second group (its tests' run id is "t": sample ids t-w0-g1-N),
    `function_calling` in its third, `two_turns` in the others and in evaluation (asyncrl-episode-...)."""
    if task["episode_id"].startswith("t-w0-g1-"):
        return misbehaving(task)
    return function_calling(task) if task["episode_id"].startswith("t-w0-g2-") else two_turns(task)


def slow_function_calling(task: dict) -> float:
    """examples/my_agents/function_calling_agent.py with a calculator that takes 50-200 ms a call (bench/agentic.py)."""
    from examples.my_agents.function_calling_agent import agent

    return agent(task, tool_latency_s=(0.05, 0.2))
