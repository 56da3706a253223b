"""The built-in task and reward, and rewards named by dotted path."""
import itertools

import pytest

from asyncrl.tasks import AdditionTask, Prompt, carry_free_sum, exact_match, make_reward, make_task


def length_reward(prompt: Prompt, response: str) -> float:
    """A user reward, loaded below by its dotted path."""
    return float(len(response))


def test_eval_set_is_held_out_and_stream_is_deterministic():
    task = AdditionTask(digits=2, eval_size=50, seed=3)
    evals = {p.prompt_id for p in task.eval_prompts()}
    assert len(evals) == 50
    train = [p.prompt_id for p in itertools.islice(task.train_prompts(seed=7), 2000)]
    assert not evals & set(train)
    assert train[:20] == [p.prompt_id for p in itertools.islice(task.train_prompts(seed=7), 20)]
    assert train[5:10] == [p.prompt_id for p in itertools.islice(task.train_prompts(seed=7, start=5), 5)]


def test_prompt_and_exact_match():
    p = AdditionTask()._prompt(37, 85)
    assert p.text == "37+85=" and p.answer == "122"
    assert exact_match(p, "122") == 1.0 and exact_match(p, " 122 ") == 1.0
    assert exact_match(p, "112") == 0.0 and exact_match(p, "1220") == 0.0


def test_carry_free_sum():
    assert carry_free_sum(37, 85) == 12  # 3+8 -> 1, 7+5 -> 2
    assert carry_free_sum(12, 34) == 46  # no carries: the true sum


def test_rewards_by_name_and_dotted_path():
    assert make_reward("exact_match") is exact_match
    fn = make_reward("tests.test_tasks.length_reward")
    assert fn(Prompt("x", "1+1=", "2"), "abc") == 3.0
    with pytest.raises(ValueError, match="no_such_module"):
        make_reward("no_such_module.fn")
    with pytest.raises(ValueError, match="not a dotted path"):
        make_reward("unknown")
    with pytest.raises(ValueError, match="registered"):
        make_task("sudoku", 2, 10, 0)
