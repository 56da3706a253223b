"""The data every task yields: a `Prompt` (text, reference answer, chat turns, its record's columns, read-only)
and the signature of a reward over one."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

def _frozen(value: Any) -> Any:
    """`value` with every mapping in it a Record and every list a tuple."""
    if isinstance(value, Mapping):
        return Record(value)
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    """The plain dicts and lists of a frozen value (what JSON, a chat template or a verl reward expects)."""
    if isinstance(value, Record):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


class Record(Mapping):
    """A data record's columns, read-only: nested mappings are Records, lists are tuples. Unlike
    types.MappingProxyType it pickles (prompts travel between Ray actors), and it hashes (by its content)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping | None = None) -> None:
        self._data = {str(k): _frozen(v) for k, v in (data or {}).items()}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Record({self._data!r})"

    def __reduce__(self) -> tuple:
        return Record, (self.to_dict(),)

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def to_dict(self) -> dict[str, Any]:
        """A plain, mutable copy (dicts and lists all the way down)."""
        return _thawed(self)

    def fingerprint(self) -> str:
        """A digest of the content (equal records, equal digests): part of the reward cache's key."""
        text = json.dumps(self.to_dict(), sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Prompt:
    """One task instance: the text shown to the policy and the reference answer; a dataset's prompt also carries its
    chat turns and every column of its record."""

    prompt_id: str
    text: str
    """The prompt as text (for a chat-message prompt: its last user turn), as the trajectory store records it."""
    answer: str
    messages: tuple[Record, ...] = ()
    """Chat turns ({role, content}) the policy is given instead of `text` (needs task.chat); empty: `text`."""
    record: Record = field(default_factory=Record)
    """Every column of the prompt's data record, read-only, for the reward (empty for procedural tasks)."""

    @property
    def content(self) -> str | list[dict]:
        """What encode_prompt renders: the chat turns when there are, else the text."""
        return [m.to_dict() for m in self.messages] if self.messages else self.text


RewardFn = Callable[[Prompt, str], float]
"""``reward(prompt, response) -> float``: every reward, built-in or a user's."""
