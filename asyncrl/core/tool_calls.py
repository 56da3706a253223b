"""OpenAI function calling on the agents' endpoint: a request's `tools` and `tool_choice` checked, messages with
`tool_calls` / `tool_call_id` in one canonical form (so a conversation sent back by an SDK compares equal to what
was answered), the tools rendered into the prompt, and a model turn parsed into `tool_calls` by vLLM's parser.

Rendering: a chat template that reads `tools` (the model's own format) is given them as transformers passes
them; any other template (SmolLM2's, the tiny model's) gets the fallback, the Hermes format that Qwen2.5 and
Hermes models are trained on and that vLLM's `hermes` parser reads:

- the tools are listed in the system message (appended to the request's own, or a system message of their own)
  as `<tools>` JSON lines, with the instruction to answer `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- an assistant message's `tool_calls` (in a first request's history) are written after its text in that form;
- `role: "tool"` messages are sent as a user turn holding one `<tool_response>...</tool_response>` per result.

Parsing is vLLM's (`vllm.tool_parsers`, `env.tool_parser`, default `hermes`): text that does not parse as a
tool call stays text, as OpenAI-compatible servers return it.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A function's name as OpenAI's API allows it."""
CHOICES = ("auto", "none")
FALLBACK_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>")


# ---- checks and canonical forms ------------------------------------------------------------------


def check_tools(tools: Any) -> list[dict] | None:
    """A request's `tools` as [{"type": "function", "function": {"name", "description"?, "parameters"?}}], or
    ValueError naming the first problem (the endpoint answers it 400) (a `parameters` that is not a JSON Schema included)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ValueError(f"tools must be a list of function tools, got {type(tools).__name__}")
    out, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ValueError(f'{where} must be {{"type": "function", "function": {{...}}}} (only function tools are supported)')
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ValueError(f"{where}.function.name must be 1-64 letters, digits, _ or -, got {name!r}")
        if name in names:
            raise ValueError(f"{where}.function.name {name!r} is given twice")
        names.add(name)
        if not isinstance(function.get("description", ""), str):
            raise ValueError(f"{where}.function.description must be a string")
        canonical = {"name": name, **({"description": function["description"]} if function.get("description") else {})}
        if function.get("parameters") is not None:
            canonical["parameters"] = _schema(function["parameters"], f"{where}.function.parameters")
        out.append({"type": "function", "function": canonical})
    return out


def _schema(parameters: Any, where: str) -> dict:
    """`parameters` if it is a JSON Schema object, else a ValueError saying why."""
    if not isinstance(parameters, dict):
        raise ValueError(f"{where} must be a JSON Schema object, got {type(parameters).__name__}")
    import jsonschema  # here: only requests with tools need it

    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as exc:
        path = "".join(f"[{p!r}]" for p in exc.path)
        raise ValueError(f"{where}{path} is not a valid JSON Schema: {exc.message}") from None
    return parameters


def check_tool_choice(choice: Any, tools: list[dict] | None) -> str:
    """`tool_choice` as "auto" or "none" (absent: "auto" with tools, "none" without); a forced call ("required" or
    a named function) is a ValueError: the policy is sampled freely, so the behaviour log-probs stay its own."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in CHOICES:
        if choice == "auto" and not tools:
            raise ValueError('tool_choice="auto" needs tools')
        return choice
    if choice == "required" or isinstance(choice, dict):
        raise ValueError(f"tool_choice={json.dumps(choice)} is not supported: a forced call would change the "
                         "distribution the policy is trained on; use \"auto\" (or \"none\")")
    raise ValueError(f"tool_choice must be \"auto\" or \"none\", got {choice!r}")


def canonical_tool_calls(calls: Any, where: str) -> list[dict]:
    """An assistant message's `tool_calls` as [{"id", "type": "function", "function": {"name", "arguments": str}}]."""
    if not isinstance(calls, list):
        raise ValueError(f"{where}.tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(call.get("id"), str) or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str)):
            raise ValueError(f'{where}.tool_calls[{j}] must be {{"id": str, "type": "function", '
                             '"function": {"name": str, "arguments": str}}')
        out.append({"id": call["id"], "type": "function", "function": {"name": function["name"], "arguments": function["arguments"]}})
    return out


# ---- rendering -----------------------------------------------------------------------------------


def template_reads_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders `tools` itself (it names them); else the fallback format is used."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in (template if isinstance(template, str) else json.dumps(template))


def for_template(messages: list[dict]) -> list[dict]:
    """Canonical messages as chat templates read them: a tool call's `arguments` as a dict, not a JSON string."""
    out = []
    for m in messages:
        if "tool_calls" in m:
            m = {**m, "tool_calls": [{**c, "function": {"name": c["function"]["name"], "arguments": _arguments(c)}}
                                     for c in m["tool_calls"]]}
        out.append(m)
    return out


def fallback(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Canonical messages in the fallback (Hermes) format, for a template that does not read tools: the tools in the
    system message, tool calls as <tool_call> text, consecutive tool results as one user turn of <tool_response>s."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
            continue
        if m.get("tool_calls"):
            calls = "\n".join(f"<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': _arguments(c)})}\n</tool_call>"
                              for c in m["tool_calls"])
            m = {"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + calls}
        out.append({"role": m["role"], "content": m["content"]})
    out = [{"role": m["role"], "content": m["content"]} for m in out]
    if tools:
        listed = FALLBACK_INSTRUCTIONS.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + listed}
        else:
            out.insert(0, {"role": "system", "content": listed})
    return out


def _arguments(call: dict) -> Any:
    """A tool call's arguments as an object when they are JSON (they are when the model wrote them), else the string."""
    try:
        return json.loads(call["function"]["arguments"])
    except ValueError:
        return call["function"]["arguments"]


# ---- parsing -------------------------------------------------------------------------------------


def parser_class(name: str):
    """vLLM's tool parser `name` (vllm.tool_parsers), or a ValueError listing the ones there are."""
    from vllm.tool_parsers import ToolParserManager  # here: vLLM loads only where a tool call is parsed

    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        raise ValueError(f"env.tool_parser={name!r} is not one of vLLM's tool parsers: "
                         f"{', '.join(sorted(ToolParserManager.list_registered()))}") from None


def parse_tool_calls(parser: type, tokenizer, text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
    """A model turn's text as (content, tool_calls) by vLLM's `parser`: no tool call, or one that does not parse
    (say, JSON cut at the token limit), leaves the whole text as content and no calls."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(model="policy", messages=[{"role": "user", "content": ""}], tools=tools, tool_choice="auto")
    log = logging.getLogger(parser.__module__)
    level = log.level
    log.setLevel(logging.CRITICAL)  # a small policy writes many broken calls: each is text, not a traceback in the log
    try:
        found = parser(tokenizer, request.tools).extract_tool_calls(text, request)
    finally:
        log.setLevel(level)
    if not found.tools_called or not found.tool_calls:
        return text, []
    calls = [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}
             for call in found.tool_calls]
    return found.content or None, calls
