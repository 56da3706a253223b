"""Token ids for the engine: a prompt as the policy reads it (`encode_prompt`), and an observation appended to an
episode token in / token out (`observation_ids`), both through the tokenizer's chat template with `task.chat`."""
from __future__ import annotations


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
