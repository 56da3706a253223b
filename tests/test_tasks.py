"""The built-in task and reward, and rewards named by dotted path."""
import itertools

import pytest

from asyncrl.core.config import TaskConfig
from asyncrl.core.prompts import Prompt
from asyncrl.core.rewards import exact_match, final_number, make_reward, numeric_match
from asyncrl.core.tasks import AdditionTask, ANSWER_FORMAT, carry_free_sum, make_task, word_problem, WordProblemTask


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


@pytest.mark.parametrize("make,dense", [(lambda dev: AdditionTask(digits=2, eval_size=50, seed=3, dev_size=dev), True),
                                        (lambda dev: WordProblemTask(steps=2, eval_size=50, seed=3, dev_size=dev), False)])
def test_dev_problems_are_apart_from_the_eval_ones_and_never_trained_on(make, dense):
    plain, task = make(0), make(40)
    assert plain.dev_prompts() == [] and [p.text for p in task.eval_prompts()] == [p.text for p in plain.eval_prompts()]
    dev, evals = {p.text for p in task.dev_prompts()}, {p.text for p in task.eval_prompts()}
    assert len(dev) == 40 and not dev & evals
    train = {p.text for p in itertools.islice(task.train_prompts(seed=7), 3000)}
    assert not (dev | evals) & train
    if dense:  # 10,000 2-digit pairs: 3,000 draws would meet some of the 40 were they not held out
        assert dev & {p.text for p in itertools.islice(plain.train_prompts(seed=7), 3000)}


def test_dev_size_is_refused_where_it_holds_nothing_out():
    from asyncrl.core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="task.dev_size.*model.path=tiny"):
        load_config(None, ["task.dev_size=10"])
    with pytest.raises(ConfigError, match="task.dev_size.*task.name=calculator"):
        load_config(None, ["model.path=smollm2-135m-instruct", "task.name=calculator", "task.dev_size=10"])
    assert load_config(None, ["model.path=smollm2-135m-instruct", "task.name=word_problems", "task.dev_size=10"]).task.dev_size == 10


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
    with pytest.raises(ValueError, match="built-in: addition, dataset, word_problems"):
        make_task(TaskConfig(name="sudoku"), 0)


def test_numeric_match_gsm8k_style():
    p = Prompt("1", "q", "She pays 3 * 4 = 12 dollars.\n#### 1,200")
    assert final_number(p.answer) == "1200"
    assert numeric_match(p, "so the answer is 1200.") == 1.0
    assert numeric_match(p, "1,200") == 1.0 and numeric_match(p, "1200.0") == 1.0
    assert numeric_match(p, "12 then 1300") == 0.0 and numeric_match(p, "no number") == 0.0
    assert make_reward("numeric_match") is numeric_match


def solve(text: str) -> int:
    """Recompute a word problem's answer from its sentences (an independent reading of the generator's phrasing)."""
    total = None
    for sentence in text.split(". "):
        words = sentence.replace("?", "").split()
        numbers = [int(w) for w in words if w.isdigit()]
        if total is None:
            total = numbers[0]
        elif "more" in words:
            total += numbers[0]
        elif "loses" in words or "away" in words:
            total -= numbers[0]
        elif "times" in words:
            total *= numbers[0]
    return total


def test_word_problems_are_correct_held_out_and_deterministic():
    task = make_task(TaskConfig(name="word_problems", steps=2, eval_size=50), seed=0)
    evals = task.eval_prompts()
    assert len({p.text for p in evals}) == 50
    train = list(itertools.islice(task.train_prompts(seed=3), 500))
    assert not {p.text for p in evals} & {p.text for p in train}
    for p in evals + train:
        assert p.text.endswith(ANSWER_FORMAT) and int(p.answer) == solve(p.text.removesuffix(ANSWER_FORMAT)) > 0
    ops = [len(p.text.removesuffix(ANSWER_FORMAT).split(". ")) - 2 for p in train]  # sentences between the start and the question
    assert {1, 2} <= set(ops) and max(ops) <= 2
    assert [p.text for p in train[10:15]] == [p.text for p in itertools.islice(task.train_prompts(seed=3, start=10), 5)]
    assert [p.text for p in WordProblemTask(2, 50, 0).eval_prompts()] == [p.text for p in evals]


def test_a_worked_word_problem_and_its_reward():
    import random

    text, answer = word_problem(random.Random(7), 1)
    assert answer == solve(text)
    p = Prompt("x", "Ben has 4 pencils. Ben loses 1 pencils. How many pencils does Ben have now?", "3")
    assert numeric_match(p, "4 - 1 = 3.\nAnswer: 3") == 1.0
    assert numeric_match(p, "Ben has 4 pencils. 4 - 1 = 3 so Ben has 3 pencils left, not 4.") == 0.0  # the last number counts
    assert numeric_match(p, "The answer is N.") == 0.0
    with pytest.raises(ValueError, match="task.steps"):
        WordProblemTask(steps=0)
