"""Token ids for the engine: a prompt as the policy reads it (`encode_prompt`), and an observation appended to an
episode token in / token out (`observation_ids`), both through the tokenizer's chat template with `task.chat`;
an agent episode's whole codec (`AgentCodec`: its requests' messages and tools in, tool calls out)."""
from __future__ import annotations

from asyncrl.core.tool_calls import fallback, for_template, parse_tool_calls, parser_class, template_reads_tools


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


class AgentCodec:
    """An agent episode's token work (asyncrl.core.agents.AgentRun), through the tokenizer's chat template: a first
    request's messages and tools into prompt ids, added messages into observation ids, sampled ids into text, and
    the text into tool calls by vLLM's parser `tool_parser` (asyncrl.core.tool_calls: the template renders the tools
    when it reads them, else the fallback format does)."""

    def __init__(self, tokenizer, tool_parser: str = "hermes") -> None:
        self.tokenizer, self.tool_parser = tokenizer, tool_parser
        self.native = template_reads_tools(tokenizer)
        self._parser = None

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        if not self.native:
            return encode_prompt(self.tokenizer, fallback(messages, tools), True)
        rendered = self.tokenizer.apply_chat_template(for_template(messages), tools=tools, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(rendered, add_special_tokens=False).input_ids)

    def delta_ids(self, messages: list[dict], after_eos: bool) -> list[int]:
        return observation_ids(self.tokenizer, for_template(messages) if self.native else fallback(messages, None), True, after_eos)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def tokens(self, ids: list[int]) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens(ids)

    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
        if self._parser is None:
            self._parser = parser_class(self.tool_parser)
        return parse_tool_calls(self._parser, self.tokenizer, text, tools)
