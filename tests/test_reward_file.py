"""Rewards from a Python file (task.reward: file.py:fn), verl-style compute_score functions, and each bad reward's
error before Ray starts (fast: no Ray, no model)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from asyncrl.core.config import load_config
from asyncrl.core.reward_files import VerlReward, check_reward_file, reward_runtime_env
from asyncrl.core.prompts import Prompt, Record
from asyncrl.core.rewards import make_reward
from asyncrl.orchestration.controller import check_plugins

ROOT = Path(__file__).resolve().parents[1]
PROMPT = Prompt("p", "1+2=", "3", record=Record({"prompt": "1+2=", "answer": "3", "weight": 0.5}))


def reward_file(tmp_path: Path, source: str, name: str = "my_reward_fixture.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def test_a_reward_in_a_file_is_loaded_by_path_and_reads_a_record_column(tmp_path):
    path = reward_file(tmp_path, "def weighted(prompt, response):\n    return prompt.record['weight'] * (response == prompt.answer)\n")
    fn = make_reward(f"{path}:weighted")
    assert (fn(PROMPT, "3"), fn(PROMPT, "4")) == (0.5, 0.0)


def test_a_relative_reward_file_is_recorded_absolute_and_shipped_with_the_job(tmp_path, monkeypatch):
    reward_file(tmp_path, "def fn(prompt, response):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["task.reward=my_reward_fixture.py:fn"])
    assert cfg.task.reward == f"{tmp_path}/my_reward_fixture.py:fn"
    assert reward_runtime_env(cfg.task.reward) == {"py_modules": [f"{tmp_path}/my_reward_fixture.py"]}
    assert reward_runtime_env("exact_match") == {} and reward_runtime_env("pkg.mod.fn") == {}
    assert load_config(None, ["task.reward=pkg.mod.fn"]).task.reward == "pkg.mod.fn"  # a dotted path stays as it is


def test_where_the_file_is_absent_the_copy_ray_shipped_is_imported_by_its_name(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    reward_file(shipped, "def fn(prompt, response):\n    return 7.0\n", "shipped_reward_fixture.py")
    monkeypatch.syspath_prepend(str(shipped))  # what py_modules does on a worker of another node
    monkeypatch.delitem(sys.modules, "shipped_reward_fixture", raising=False)
    assert make_reward("/driver/only/shipped_reward_fixture.py:fn")(PROMPT, "") == 7.0


def verl_record(answer_format: str) -> Prompt:
    """A record of examples/gsm8k_like/make_data.py, as task.name=dataset makes it a Prompt."""
    sys.path.insert(0, str(ROOT / "examples/gsm8k_like"))
    try:
        from make_data import record, word_problem
    finally:
        sys.path.pop(0)
    question, answer = word_problem(random.Random(0), 1)
    rec = record(question, answer, "train", 0, answer_format)
    return Prompt("p", rec["prompt"][0]["content"], str(answer), record=Record(rec))


def test_a_verl_compute_score_gets_the_record_extra_info_and_ground_truth():
    fn = make_reward(f"{ROOT}/examples/gsm8k_like/reward.py:compute_score")
    assert isinstance(fn, VerlReward)
    hashes, answers = verl_record("####"), verl_record("Answer:")
    truth = hashes.answer
    # the marker each record's extra_info names decides: the same reply is right for one record, half right for the other
    assert (fn(hashes, f"so #### {truth}"), fn(answers, f"so #### {truth}")) == (1.0, 0.5)
    assert (fn(answers, f"Answer: {truth}"), fn(hashes, "#### 999")) == (1.0, 0.0)


def test_a_verl_reward_may_return_a_dict_with_a_score(tmp_path):
    path = reward_file(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                 "    return {'score': float(solution_str == ground_truth), 'acc': True}\n"
                                 "def no_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                 "    return {'acc': 1}\n")
    assert make_reward(f"{path}:compute_score")(PROMPT, "3") == 1.0  # no reward_model column: ground_truth is the answer
    with pytest.raises(ValueError, match="verl-style reward returned a dict without 'score' \\(keys: acc\\)"):
        make_reward(f"{path}:no_score")(PROMPT, "3")


@pytest.mark.parametrize("source, spec, message", [
    (None, "{dir}/absent.py:fn", "task.reward: reward file not found: {dir}/absent.py"),
    ("def other(prompt, response):\n    return 0.0\nhelper = 1\n", "{dir}/my_reward_fixture.py:score",
     "task.reward: {dir}/my_reward_fixture.py has no 'score' (its functions: other)"),
    ("def score(response):\n    return 0.0\n", "{dir}/my_reward_fixture.py:score",
     "task.reward: '{dir}/my_reward_fixture.py:score' takes (response); a reward is fn(prompt, response) -> float, or verl's "
     "compute_score(data_source, solution_str, ground_truth, extra_info)"),
    ("def score(solution_str, ground_truth):\n    return 0.0\n", "{dir}/my_reward_fixture.py:score",
     "task.reward: '{dir}/my_reward_fixture.py:score' takes (solution_str, ground_truth), which names verl's solution_str but "
     "cannot be called with data_source, solution_str, ground_truth, extra_info"),
    ("score = 3\n", "{dir}/my_reward_fixture.py:score", "task.reward: '{dir}/my_reward_fixture.py:score' is not callable"),
    ("raise RuntimeError('boom')\n", "{dir}/my_reward_fixture.py:score", "task.reward: loading {dir}/my_reward_fixture.py raised RuntimeError('boom')"),
])
def test_a_bad_reward_file_fails_before_ray_with_its_error(tmp_path, source, spec, message):
    if source is not None:
        reward_file(tmp_path, source)
    sys.modules.pop("my_reward_fixture", None)
    cfg = load_config(None, [f"task.reward={spec.format(dir=tmp_path)}"])
    with pytest.raises(ValueError) as err:
        check_plugins(cfg)
    assert str(err.value) == message.format(dir=tmp_path)


def test_a_reward_file_named_like_an_importable_module_is_refused(tmp_path):
    path = reward_file(tmp_path, "def fn(prompt, response):\n    return 0.0\n", "json.py")
    with pytest.raises(ValueError, match="task.reward: the file's name 'json.py' is the name of an importable module .*rename the file"):
        check_reward_file(f"{path}:fn")


def test_a_dotted_path_reward_with_a_wrong_signature_is_refused_too():
    with pytest.raises(ValueError, match="task.reward: 'random.random' takes \\(\\); a reward is fn\\(prompt, response\\)"):
        make_reward("random.random")
