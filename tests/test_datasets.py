"""Your own data (task.name=dataset): the four file formats, templates and nested answers, chat-message prompts,
the validation split, the old task.name=jsonl keys, and each bad input's error (fast: no Ray, no model)."""
from __future__ import annotations

import itertools
import json
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.core.config import ConfigError, DataConfig, load_config
from asyncrl.core.datasets import DataTask, split_indices
from asyncrl.core.models.tiny import build_tokenizer
from asyncrl.core.scoring import cache_key
from asyncrl.core.chat import encode_prompt
from asyncrl.core.prompts import Prompt, Record
from asyncrl.core.tasks import make_task

RECORDS = [{"question": f"{i}+{i}=", "answer": str(2 * i), "meta": {"level": i % 3, "truth": str(2 * i)}} for i in range(12)]


def write(path, records, fmt):
    """`records` as a file of `fmt` at `path` (Arrow: the IPC stream format that Dataset.save_to_disk writes)."""
    table = pa.Table.from_pylist(records)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt == "json":
        path.write_text(json.dumps(records))
    elif fmt == "parquet":
        pq.write_table(table, path)
    else:
        with pa.ipc.new_stream(path, table.schema) as writer:
            writer.write_table(table)
    return str(path)


def task_of(tmp_path, records=RECORDS, fmt="jsonl", chat=False, eval_size=200, **data) -> DataTask:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data.setdefault("train", write(tmp_path / f"train.{fmt}", records, fmt))
    return DataTask(DataConfig(prompt_key="question", cache_dir=str(tmp_path / "cache"), **data), chat, eval_size)


@pytest.mark.parametrize("fmt", ["json", "parquet", "arrow"])
def test_jsonl_json_parquet_and_arrow_files_load_to_the_same_prompts(tmp_path, fmt):
    want = task_of(tmp_path / "a", val_size=3)
    got = task_of(tmp_path / "b", fmt=fmt, val_size=3)
    assert got.eval_prompts() == want.eval_prompts()
    assert list(itertools.islice(got.train_prompts(seed=1), 20)) == list(itertools.islice(want.train_prompts(seed=1), 20))
    first = got.eval_prompts()[0]
    assert first.record["meta"]["level"] == int(first.answer) // 2 % 3  # every column reaches the prompt, nested ones too


def test_a_directory_is_read_whole_and_an_extension_can_be_forced(tmp_path):
    (tmp_path / "d").mkdir()
    write(tmp_path / "d" / "part-0.jsonl", RECORDS[:5], "jsonl")
    write(tmp_path / "d" / "part-1.jsonl", RECORDS[5:], "jsonl")
    assert len(task_of(tmp_path, train=str(tmp_path / "d"), val_size=2).train_rows) == 10
    odd = write(tmp_path / "records.txt", RECORDS, "parquet")
    assert len(task_of(tmp_path, train=odd, format="parquet", val_size=2).train_rows) == 10


def test_a_template_fills_from_the_columns_and_a_dotted_answer_key_reaches_into_a_nested_one(tmp_path):
    task = task_of(tmp_path, template="Q: {question} (level {meta[level]})\nA:", answer_key="meta.truth", val=write(tmp_path / "v.jsonl", RECORDS[:2], "jsonl"))
    assert [(p.prompt_id, p.text, p.answer) for p in task.eval_prompts()] == [("val-0", "Q: 0+0= (level 0)\nA:", "0"), ("val-1", "Q: 1+1= (level 1)\nA:", "2")]


def test_the_val_file_gives_the_eval_prompts_capped_by_task_eval_size(tmp_path):
    task = task_of(tmp_path, val=write(tmp_path / "v.parquet", RECORDS[:8], "parquet"), eval_size=5)
    assert [p.text for p in task.eval_prompts()] == [f"{i}+{i}=" for i in range(5)]
    assert len(task.train_rows) == 12  # the whole train file trains


def test_the_train_stream_covers_each_record_once_an_epoch_reshuffles_and_resumes_at_a_cursor(tmp_path):
    task = task_of(tmp_path, val_size=2)
    stream = [p.text for p in itertools.islice(task.train_prompts(seed=1), 20)]
    assert sorted(stream[:10]) == sorted(p.text for p in itertools.islice(task.train_prompts(seed=1), 10))
    assert len(set(stream[:10])) == 10 and stream[10:20] != stream[:10] and sorted(stream[10:20]) == sorted(stream[:10])
    assert stream[3:8] == [p.text for p in itertools.islice(task.train_prompts(seed=1, start=3), 5)]


def test_the_split_is_deterministic_for_a_seed_and_disjoint():
    train, val = split_indices(100, 10, seed=3)
    assert (train, val) == split_indices(100, 10, seed=3)
    assert len(val) == 10 and not set(train) & set(val) and sorted(train + val) == list(range(100))
    assert split_indices(100, 10, seed=4)[1] != val


def test_split_off_records_never_train(tmp_path):
    task = task_of(tmp_path, val_size=4, split_seed=7)
    evals = {p.text for p in task.eval_prompts()}
    trained = {p.text for p in itertools.islice(task.train_prompts(seed=0), 40)}
    assert len(evals) == 4 and not evals & trained and len(evals | trained) == 12


CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}1={% else %}2={% endif %}{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}3={% endif %}")
"""A chat template the tiny tokenizer can spell (digits, + and =): 1= opens a system turn, 2= a user turn, 3= the reply."""


def test_a_messages_column_is_the_chat_turns_rendered_by_the_chat_template(tmp_path):
    records = [{"prompt": [{"role": "system", "content": "9"}, {"role": "user", "content": "1+2="}], "answer": "3"}] * 3
    task = DataTask(DataConfig(train=write(tmp_path / "m.parquet", records, "parquet"), val_size=1, cache_dir=str(tmp_path / "c")), chat=True, eval_size=1)
    prompt = task.eval_prompts()[0]
    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    assert prompt.text == "1+2="  # the last user turn, as the trajectory store records it
    assert encode_prompt(tokenizer, prompt.content, chat=True) == tokenizer("1=92=1+2=3=", add_special_tokens=False).input_ids


def test_a_system_prompt_is_put_before_a_plain_text_prompt_with_chat(tmp_path):
    prompt = task_of(tmp_path, chat=True, system_prompt="9", val_size=1).eval_prompts()[0]
    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    rendered = f"1=92={prompt.text}3="
    assert encode_prompt(tokenizer, prompt.content, chat=True) == tokenizer(rendered, add_special_tokens=False).input_ids


def test_a_prompt_record_is_read_only_picklable_and_part_of_the_reward_cache_key(tmp_path):
    prompt = task_of(tmp_path, val_size=1).eval_prompts()[0]
    with pytest.raises(TypeError):
        prompt.record["answer"] = "x"  # type: ignore[index]
    copy = pickle.loads(pickle.dumps(prompt))
    assert copy == prompt and hash(copy) == hash(prompt) and copy.record["meta"]["truth"] == prompt.answer
    other = Prompt(prompt.prompt_id, prompt.text, prompt.answer, record=Record({**prompt.record.to_dict(), "meta": {"level": 9}}))
    assert cache_key("r", "1", other, "x") != cache_key("r", "1", prompt, "x")  # a reward may read any column


def test_the_old_jsonl_task_keys_are_read_into_the_data_section(tmp_path):
    cfg = load_config(None, ["model.path=/m", "task.name=jsonl", f"task.path={tmp_path}/d.jsonl", "task.prompt_key=question",
                             "task.template=Q={question}", "task.eval_size=3"])
    assert cfg.task.name == "dataset"
    assert (cfg.data.train, cfg.data.prompt_key, cfg.data.template, cfg.data.val_size) == (f"{tmp_path}/d.jsonl", "question", "Q={question}", 3)
    write(tmp_path / "d.jsonl", RECORDS, "jsonl")
    assert len(make_task(cfg.task, 0, cfg.data).eval_prompts()) == 3
    with pytest.raises(ConfigError, match="task.prompt_key: replaced by data.prompt_key; give only that"):
        load_config(None, ["task.prompt_key=q", "data.prompt_key=q"])


def test_relative_data_paths_are_recorded_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["model.path=/m", "task.name=dataset", "data.train=d/train.parquet", "data.val=v.jsonl"])
    assert (cfg.data.train, cfg.data.val) == (str(tmp_path / "d/train.parquet"), str(tmp_path / "v.jsonl"))


@pytest.mark.parametrize("overrides, message", [
    (["task.name=dataset", "data.val_size=2"], "data.train: must name a file or directory of records when task.name=dataset"),
    (["task.name=dataset", "data.train=t.jsonl"], "data.val: run.eval needs held-out records"),
    (["task.name=dataset", "data.train=t.jsonl", "data.val=v.jsonl", "data.val_size=2"], "data.val_size: give data.val (a file) or data.val_size"),
    (["task.name=dataset", "data.train=t.jsonl", "data.val_size=2", "data.system_prompt=Be brief."], "data.system_prompt: is a chat turn: it needs task.chat=true"),
])
def test_config_errors_name_the_data_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, ["model.path=/m", *overrides])


def bad_file(tmp_path, kind):
    """A data file with one problem, and the rest of its DataConfig."""
    if kind == "missing":
        return str(tmp_path / "nope.parquet"), {}
    if kind == "format":
        (tmp_path / "d.csv").write_text("question,answer\n1+1=,2\n")
        return str(tmp_path / "d.csv"), {}
    if kind == "unreadable":
        (tmp_path / "d.parquet").write_bytes(b"not parquet at all")
        return str(tmp_path / "d.parquet"), {}
    if kind == "bad_json":
        (tmp_path / "d.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n{not json\n')
        return str(tmp_path / "d.jsonl"), {}
    if kind == "empty":
        pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), tmp_path / "d.parquet")
        return str(tmp_path / "d.parquet"), {}
    if kind == "empty_jsonl":
        (tmp_path / "d.jsonl").write_text("")
        return str(tmp_path / "d.jsonl"), {}
    if kind == "empty_dir":
        (tmp_path / "d").mkdir()
        return str(tmp_path / "d"), {}
    path = write(tmp_path / "d.jsonl", RECORDS, "jsonl")
    return path, {"prompt_key": {"prompt_key": "prompt"}, "answer_key": {"answer_key": "meta.gold"}, "template": {"template": "{question} {hint}"},
                  "val_size": {"val_size": 12}, "messages": {}}[kind]


@pytest.mark.parametrize("kind, message", [
    ("missing", "data.train: no such file or directory: {dir}/nope.parquet"),
    ("format", "data.train: cannot tell the format of {dir}/d.csv from its extension '.csv' (known: .jsonl, .json, .parquet, .arrow); set data.format"),
    ("unreadable", "data.train: cannot read {dir}/d.parquet as parquet: "),
    ("bad_json", "data.train: cannot read {dir}/d.jsonl as json: "),
    ("empty", "data.train: {dir}/d.parquet has no records"),
    ("empty_jsonl", "data.train: {dir}/d.jsonl has no records"),
    ("empty_dir", "data.train: no data files in {dir}/d"),
    ("prompt_key", "data.prompt_key: no column 'prompt' in {dir}/d.jsonl (columns: question, answer, meta)"),
    ("answer_key", "data.answer_key: no column 'meta.gold' in {dir}/d.jsonl (columns: question, answer, meta, meta.level, meta.truth)"),
    ("template", "data.template: no column 'hint' in {dir}/d.jsonl (columns: question, answer, meta)"),
    ("val_size", "data.val_size: 12 must be smaller than the 12 records of data.train ({dir}/d.jsonl)"),
])
def test_bad_data_fails_with_an_error_naming_the_key_and_the_file(tmp_path, kind, message):
    train, data = bad_file(tmp_path, kind)
    data.setdefault("prompt_key", "question")
    with pytest.raises(ValueError) as err:
        DataTask(DataConfig(train=train, val_size=data.pop("val_size", 1), cache_dir=str(tmp_path / "cache"), **data), chat=False, eval_size=5)
    assert str(err.value).startswith(message.format(dir=tmp_path))


def test_a_messages_prompt_without_chat_is_an_error_naming_the_fix(tmp_path):
    records = [{"prompt": [{"role": "user", "content": "1+2="}], "answer": "3"}] * 2
    with pytest.raises(ValueError, match="data.prompt_key: column 'prompt' holds chat messages.*set task.chat=true"):
        DataTask(DataConfig(train=write(tmp_path / "m.jsonl", records, "jsonl"), val_size=1, cache_dir=str(tmp_path / "c")), chat=False, eval_size=1)
