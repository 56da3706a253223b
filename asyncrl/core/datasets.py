"""Your own prompts: local JSONL, JSON, Parquet or Arrow files read by the Hugging Face ``datasets`` library.

`task.name=dataset` and the `data` section (asyncrl.core.config.DataConfig) select it; docs/data.md is the user's
page. A record becomes a `Prompt`: its text from `data.template` or the `data.prompt_key` column (a column of chat
messages is kept as the chat turns), its answer from the `data.answer_key` column (a dotted path reaches into
nested columns, e.g. verl's ``reward_model.ground_truth``), and every column as `Prompt.record`, for the reward.
Only the prompt text goes to the trajectory store, as for every task.

The files are read with ``datasets.load_dataset`` (its json, parquet and arrow builders), which converts them to
Arrow once, in its cache, and maps them from there: each rollout worker reads the same cache, and a record is
made a Prompt only when it is drawn. Everything is local, so it works offline (HF_HUB_OFFLINE=1, as in the actors).
Every problem a file can have is a ValueError naming the key and the file, raised where the task is built: in
`check_plugins`, before Ray starts.
"""
from __future__ import annotations

import random
import re
import string
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.core.prompts import Prompt, Record

if TYPE_CHECKING:
    import datasets

    from asyncrl.core.config import DataConfig

EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
"""File extension -> the datasets builder that reads it (data.format=auto)."""
BUILDERS = {"jsonl": "json", "json": "json", "parquet": "parquet", "arrow": "arrow"}
"""data.format -> the datasets builder."""
METADATA = frozenset({"dataset_info.json", "state.json"})
"""Files of a `Dataset.save_to_disk` directory that hold no records."""


def data_files(path: str, fmt: str, key: str) -> tuple[list[str], str]:
    """The files at `path` (a file, or a directory's data files) and the builder that reads them; `key` names the
    config key in errors."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{key}: no such file or directory: {path}")
    if p.is_file():
        files = [p]
    else:
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".") and f.name not in METADATA
                       and (fmt != "auto" or f.suffix in EXTENSIONS))
    if not files:
        raise ValueError(f"{key}: no data files in {path} (looked for {', '.join(EXTENSIONS)})")
    if fmt != "auto":
        return [str(f) for f in files], BUILDERS[fmt]
    unknown = [f for f in files if f.suffix not in EXTENSIONS]
    if unknown:
        raise ValueError(f"{key}: cannot tell the format of {unknown[0]} from its extension {unknown[0].suffix!r} "
                         f"(known: {', '.join(EXTENSIONS)}); set data.format")
    builders = sorted({EXTENSIONS[f.suffix] for f in files})
    if len(builders) > 1:
        raise ValueError(f"{key}: {path} holds files of several formats ({', '.join(builders)}); keep one, or set data.format")
    return [str(f) for f in files], builders[0]


def load_records(path: str, fmt: str, key: str, cache_dir: str = "") -> datasets.Dataset:
    """The records of `path` as a datasets.Dataset; a ValueError naming `key` when they cannot be read or there are none."""
    import datasets

    files, builder = data_files(path, fmt, key)
    if all(_surely_empty(f, builder) for f in files):  # the library's own error for these is about something else
        raise ValueError(f"{key}: {path} has no records")
    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()
    try:
        ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache_dir or None)
    except Exception as exc:  # the library raises many kinds for a file it cannot parse; each becomes one message
        raise ValueError(f"{key}: cannot read {path} as {builder}: {_reason(exc)}") from exc
    if len(ds) == 0:
        raise ValueError(f"{key}: {path} has no records")
    return ds


def _surely_empty(file: str, builder: str) -> bool:
    """Whether `file` holds no records for certain: no bytes, an empty JSON list, a Parquet file of no rows."""
    size = Path(file).stat().st_size
    if size < 16:
        return Path(file).read_bytes().strip() in (b"", b"[]")
    if builder != "parquet":
        return False
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(file).num_rows == 0
    except (OSError, ValueError):  # not Parquet: the load says so
        return False


def _reason(exc: BaseException) -> str:
    """The innermost cause's message (the library wraps a parser's error in its own)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}"


def column_paths(features: Mapping, prefix: str = "") -> list[str]:
    """Every column, and every field of a nested (struct) column as a dotted path: a, b, b.c."""
    paths = []
    for name, feature in features.items():
        paths.append(prefix + name)
        if isinstance(feature, dict):
            paths += column_paths(feature, f"{prefix}{name}.")
    return paths


def template_columns(template: str) -> list[str]:
    """The columns a str.format template names: "{question}" and "{extra_info[index]}" name question, extra_info."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(f"data.template: not a str.format template ({exc})") from None
    columns = [re.split(r"[.\[]", f, maxsplit=1)[0] for f in fields]
    if any(not c or c.isdigit() for c in columns):
        raise ValueError(f"data.template: every field must name a column, e.g. {{question}} (got {template!r})")
    return columns


def check_columns(ds: datasets.Dataset, cfg: DataConfig, path: str) -> None:
    """The prompt, answer and template columns exist in `ds` (read from `path`): else a ValueError naming the key,
    the column and the ones there are."""
    columns, nested = ds.column_names, column_paths(ds.features)
    wanted = [("data.template", c) for c in template_columns(cfg.template)] if cfg.template else [("data.prompt_key", cfg.prompt_key)]
    for key, column in wanted:
        if column not in columns:
            raise ValueError(f"{key}: no column {column!r} in {path} (columns: {', '.join(columns)})")
    if cfg.answer_key and cfg.answer_key not in nested:
        raise ValueError(f"data.answer_key: no column {cfg.answer_key!r} in {path} (columns: {', '.join(nested)})")


def split_indices(n: int, val_size: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) row indices: `val_size` of `n` rows drawn at random by `seed`, the rest for training; each sorted."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[val_size:]), sorted(order[:val_size])


def is_messages(value: Any) -> bool:
    """Whether a prompt column's value is a list of chat messages ({role, content} mappings)."""
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value))


def answer_of(record: Mapping, dotted: str) -> str:
    """The value at `dotted` (a column, or a path into nested ones) as text; "" for no answer key or a null."""
    value: Any = record
    for part in dotted.split(".") if dotted else ():
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def make_prompt(record: dict, prompt_id: str, cfg: DataConfig, chat: bool) -> Prompt:
    """One record as a Prompt (see the module docstring); a ValueError naming the record when it cannot be one."""
    value = record[cfg.prompt_key] if not cfg.template else None
    messages: tuple[Record, ...] = ()
    if is_messages(value):
        if not chat:
            raise ValueError(f"data.prompt_key: column {cfg.prompt_key!r} holds chat messages, which the tokenizer's chat "
                             "template renders: set task.chat=true")
        messages = tuple(Record(m) for m in value)
        text = next((str(m["content"]) for m in reversed(value) if m["role"] == "user"), str(value[-1]["content"]))
    else:
        text = _text(record, value, cfg.template, prompt_id)
        if chat and cfg.system_prompt:
            messages = (Record({"role": "system", "content": cfg.system_prompt}), Record({"role": "user", "content": text}))
    return Prompt(prompt_id, text, answer_of(record, cfg.answer_key), messages, Record(record))


def _text(record: dict, value: Any, template: str, prompt_id: str) -> str:
    if not template:
        return "" if value is None else str(value)
    try:
        return template.format(**record)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"data.template: cannot fill it from record {prompt_id} ({type(exc).__name__}: {exc})") from None


class DataTask:
    """Training prompts from `data.train`, evaluation prompts from `data.val` (at most `eval_size` of them) or the
    `data.val_size` records split off `data.train`. Prompts are made from the records as they are drawn."""

    name = "dataset"

    def __init__(self, cfg: DataConfig, chat: bool, eval_size: int) -> None:
        self.cfg, self.chat = cfg, chat
        self.train = load_records(cfg.train, cfg.format, "data.train", cfg.cache_dir)
        check_columns(self.train, cfg, cfg.train)
        self.train_rows, val_rows = list(range(len(self.train))), []
        if cfg.val:
            self.val = load_records(cfg.val, cfg.format, "data.val", cfg.cache_dir)
            check_columns(self.val, cfg, cfg.val)
            val_rows = list(range(len(self.val)))
        else:
            self.val = self.train
            if cfg.val_size >= len(self.train):
                raise ValueError(f"data.val_size: {cfg.val_size} must be smaller than the {len(self.train)} records of "
                                 f"data.train ({cfg.train}), which keeps the rest for training")
            if cfg.val_size:
                self.train_rows, val_rows = split_indices(len(self.train), cfg.val_size, cfg.split_seed)
        self.val_rows = val_rows[:eval_size]
        self._prompt(self.train, self.train_rows[0], "train")  # a record that cannot be a prompt fails here, before Ray

    def _prompt(self, ds: datasets.Dataset, row: int, split: str) -> Prompt:
        record = ds[row]
        prompt_id = str(record["id"]) if "id" in record else f"{split}-{row}"
        return make_prompt(record, prompt_id, self.cfg, self.chat)

    def eval_prompts(self) -> list[Prompt]:
        split = "val" if self.cfg.val else "train"  # a split-off record keeps its data.train row as its id
        return [self._prompt(self.val, row, split) for row in self.val_rows]

    def train_prompts(self, seed: int, start: int = 0) -> Iterator[Prompt]:
        """Endless epochs over the training records, each shuffled by (seed, epoch); `start` skips that many prompts
        (a data cursor) without reading them."""
        i, epoch = 0, 0
        while True:
            order = list(self.train_rows)
            random.Random(seed * 100_003 + epoch).shuffle(order)
            for row in order:
                if i >= start:
                    yield self._prompt(self.train, row, "train")
                i += 1
            epoch += 1
