"""OpenAI function calling on the agents' endpoint, without an engine: tools and tool choices checked with the
reason, messages with tool calls in one canonical form, tools rendered by the chat template or the Hermes fallback,
and a whole function-calling episode played by the `openai` client against the real endpoint with no episode id
(only its base URL), a thread standing for the worker's loop and sampling scripted tokens: the tool call is parsed
by vLLM's parser, the SDK's echo of it accepted, and the stored tokens are the sampled ones plus the tool result's."""
from __future__ import annotations

import json
import threading
import time

import openai
import pytest
from transformers import AutoTokenizer

from asyncrl.core.agent_endpoint import Endpoint
from asyncrl.core.agents import AgentEnd, AgentRun
from asyncrl.core.chat import AgentCodec, encode_prompt
from asyncrl.core.chat_api import ChatRequestError, normalise_messages, parse_request
from asyncrl.core.episode import EpisodeLimits
from asyncrl.core.tool_calls import fallback, template_reads_tools

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                       "required": ["a", "b"]}}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOL_TEMPLATE = (  # a Qwen2.5-like template that reads `tools` itself
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments.a }}</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def body(**extra) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "2 + 3?"}], "user": "e", **extra}).encode()


def test_tools_and_tool_choice_are_checked_with_the_reason():
    req = parse_request(body(tools=[ADD]), None)
    assert req.tools == [ADD] and req.tool_choice == "auto"
    assert parse_request(body(), None).tool_choice == "none" and parse_request(body(tools=[ADD], tool_choice="none"), None).tool_choice == "none"
    bare = {"type": "function", "function": {"name": "now"}}  # no description, no parameters: fine
    assert parse_request(body(tools=[bare]), None).tools == [bare]
    schema = ADD["function"]["parameters"]
    for extra, words in (({"tools": {"add": ADD}}, "tools must be a list"),
                         ({"tools": [{"type": "retrieval"}]}, "tools[0] must be"),
                         ({"tools": [{"type": "function", "function": {"name": "two words"}}]}, "tools[0].function.name must be"),
                         ({"tools": [ADD, ADD]}, "tools[1].function.name 'add' is given twice"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters must be a JSON Schema object"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {**schema, "required": "a"}}}]},
                          "tools[0].function.parameters['required'] is not a valid JSON Schema"),
                         ({"tools": [ADD], "tool_choice": "required"}, 'tool_choice="required" is not supported'),
                         ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "add"}}}, "a forced call"),
                         ({"tool_choice": "auto"}, 'tool_choice="auto" needs tools'),
                         ({"tools": [ADD], "tool_choice": "sometimes"}, "tool_choice must be"),
                         ({"functions": [ADD["function"]]}, "`functions` API is not supported")):
        with pytest.raises(ChatRequestError, match=None) as err:
            parse_request(body(**extra), None)
        assert err.value.status == 400 and words in str(err.value), (extra, str(err.value))


def test_messages_with_tool_calls_take_one_canonical_form():
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    echoed = {"role": "assistant", "content": None, "refusal": None, "annotations": [], "tool_calls": [{**call, "index": 0}]}
    answered = {"role": "assistant", "content": "", "tool_calls": [call]}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "5", "name": "add"}
    assert normalise_messages([echoed, tool]) == [answered, {"role": "tool", "content": "5", "tool_call_id": "call_1"}]
    assert normalise_messages([{"role": "assistant", "content": "hi", "tool_calls": []}]) == [{"role": "assistant", "content": "hi"}]
    for messages, words in (([{"role": "tool", "content": "5"}], "needs the tool_call_id"),
                            ([{**echoed, "tool_calls": [{"id": "c", "function": {"name": "add", "arguments": {"a": 2}}}]}], "messages[0].tool_calls[0] must be"),
                            ([{"role": "user", "content": None}], "messages[0].content must be a string")):
        with pytest.raises(ChatRequestError, match=None) as err:
            normalise_messages(messages)
        assert words in str(err.value)


def test_the_fallback_lists_tools_in_the_system_message_and_writes_calls_and_results_as_hermes_does():
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    messages = [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "Adding.", "tool_calls": [call]},
                {"role": "tool", "content": "5", "tool_call_id": "c1"}, {"role": "tool", "content": "ok", "tool_call_id": "c2"},
                {"role": "user", "content": "So?"}]
    out = fallback(messages, [ADD])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "user"]
    assert out[0]["content"].startswith("# Tools") and json.dumps(ADD) in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2]["content"] == "Adding.\n" + CALL
    assert out[3]["content"] == "<tool_response>\n5\n</tool_response>\n<tool_response>\nok\n</tool_response>"  # consecutive results: one turn
    assert fallback([{"role": "system", "content": "Be brief."}, messages[0]], [ADD])[0]["content"].startswith("Be brief.\n\n# Tools")
    assert fallback(messages[:1], None) == messages[:1]


def test_a_template_that_reads_tools_renders_them_itself(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert not template_reads_tools(tok)  # SmolLM2's template: the fallback
    codec = AgentCodec(tok)
    assert codec.prompt_ids([{"role": "user", "content": "2 + 3?"}], [ADD]) == encode_prompt(tok, fallback([{"role": "user", "content": "2 + 3?"}], [ADD]), True)
    tok.chat_template = TOOL_TEMPLATE
    codec = AgentCodec(tok)
    assert template_reads_tools(tok) and codec.native
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ids = codec.prompt_ids([{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                            {"role": "tool", "content": "5", "tool_call_id": "c1"}], [ADD])
    text = tok.decode(ids)
    assert "TOOLS: add" in text and "<tool_call>add 2</tool_call>" in text and "<tool_response>5</tool_response>" in text  # arguments as an object
    assert tok.decode(codec.delta_ids([{"role": "tool", "content": "5", "tool_call_id": "c1"}], after_eos=True)) == \
        "\n<|im_start|>user\n<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n"


class ScriptedLoop:
    """A thread standing for the worker's loop: each request goes to its episode's AgentRun, and the model's turn is
    the next scripted text's tokens (with EOS), at log-prob -0.5 and version 7."""

    def __init__(self, tok, endpoint: Endpoint, runs: dict[str, AgentRun], script: list[str]) -> None:
        self.tok, self.endpoint, self.runs, self.script, self.sampled = tok, endpoint, runs, list(script), []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            for request in self.endpoint.take():
                run = self.runs[request.episode_id]
                run.tool_done(request)
                if run.request is request:  # taken: the model's turn
                    ids = self.tok(self.script.pop(0), add_special_tokens=False).input_ids + [self.tok.eos_token_id]
                    self.sampled.append(ids)
                    run.model_turn(ids, [-0.5] * len(ids), [7] * len(ids))
            time.sleep(0.005)


def test_a_function_calling_agent_that_passes_no_episode_id_is_recorded_token_exact(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    codec = AgentCodec(tok)
    run = AgentRun("ep-1", EpisodeLimits(4, 200, 64), codec, frozenset({tok.eos_token_id}), 1000)
    endpoint = Endpoint(0, lambda episode_id: episode_id == "ep-1", wait_s=30.0)
    loop = ScriptedLoop(tok, endpoint, {"ep-1": run}, ["Let me add. " + CALL, "The answer is 5."])
    try:
        client = openai.OpenAI(base_url=endpoint.episode_url("ep-1"), api_key="none", max_retries=0, timeout=30)
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        first = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add. "
        [call] = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
        messages.append(choice.message)  # the SDK's own object, sent back as it is
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
        second = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "The answer is 5."
        assert second.choices[0].message.tool_calls is None
    finally:
        loop.stop.set()
        endpoint.close()
    run.tool_done(AgentEnd(1.0))
    ep, (s1, s2) = run.episode, loop.sampled
    assert run.finish_reason == "stop" and run.end.reward == 1.0
    assert ep.prompt_ids == codec.prompt_ids([{"role": "user", "content": "What is 2 + 3?"}], [ADD])
    result = codec.delta_ids([{"role": "tool", "content": "5", "tool_call_id": call.id}], after_eos=True)
    assert tok.decode(result) == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert ep.response_ids == s1 + result + s2  # the sampled tokens, never re-tokenised, and the result's
    assert ep.loss_mask == [1] * len(s1) + [0] * len(result) + [1] * len(s2)
    assert ep.token_versions == [7] * len(s1) + [-1] * len(result) + [7] * len(s2)
    assert first.model_extra["asyncrl"]["token_ids"] == s1


def test_a_malformed_tool_call_is_returned_as_text_and_changed_tools_are_refused(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    run = AgentRun("ep-2", EpisodeLimits(4, 200, 64), AgentCodec(tok), frozenset({tok.eos_token_id}), 1000)
    endpoint = Endpoint(0, lambda episode_id: episode_id == "ep-2", wait_s=30.0)
    broken = '<tool_call>\n{"name": add, "arguments": {"a": 2}}\n</tool_call>'
    loop = ScriptedLoop(tok, endpoint, {"ep-2": run}, [broken])
    try:
        client = openai.OpenAI(base_url=endpoint.episode_url("ep-2"), api_key="none", max_retries=0, timeout=30)
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content == broken
        assert reply.choices[0].message.tool_calls is None
        messages += [reply.choices[0].message, {"role": "user", "content": "Try again."}]
        with pytest.raises(openai.BadRequestError, match="tools differ from the first request"):
            client.chat.completions.create(model="policy", messages=messages, tools=[{"type": "function", "function": {"name": "sub"}}])
    finally:
        loop.stop.set()
        endpoint.close()
    assert run.finish_reason == "tool_error" and "tools differ" in run.end.reason
