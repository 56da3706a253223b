"""The environment plugin API and an episode's token bookkeeping (asyncrl.core.envs): pure logic, no engine."""
from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from asyncrl.core.envs import (
    CalculatorEnv, Environment, EnvStep, Episode, GuessNumberEnv, ToolCall, arithmetic_problem, calculator,
    calculator_prompts, guess_number_prompts, make_environment, observation_ids, registered_environments,
)
from asyncrl.core.tasks import Prompt


def test_calculator_does_integer_arithmetic_and_refuses_anything_else():
    assert calculator("347 * 29 + 118") == str(347 * 29 + 118)
    assert calculator("(12 - 20) * 3") == "-24"
    assert calculator(" 7 // 2 ") == "3"
    for bad in ("__import__('os')", "2 ** 10", "1.5 + 1", "x + 1", "1 / 0", "9" * 10 + " * " + "9" * 10):
        assert calculator(bad).startswith("error:"), bad
    assert calculator("1 // 0").startswith("error:")


def test_arithmetic_problems_are_deterministic_and_correct():
    a = [arithmetic_problem(random.Random(3), 2) for _ in range(2)]
    assert a[0] == a[1]
    expression, value = a[0]
    assert eval(expression) == value  # noqa: S307 - the test's own expression
    prompts = [p for _, p in zip(range(3), calculator_prompts(0, 3))]
    assert prompts == [p for _, p in zip(range(3), calculator_prompts(0, 3))]
    assert next(calculator_prompts(0, 3, start=2)) == prompts[2]  # a data cursor skips exactly that many


def test_the_default_tool_call_syntax_is_parsed():
    env = CalculatorEnv(Prompt("p", "Compute 2 + 3.", "5"), seed=0)
    assert env.tool_call("Let me see. <tool>calc: 2 + 3</tool>") == ToolCall("calc", "2 + 3")
    assert env.tool_call("<tool> calc :\n 4*5 </tool> and more") == ToolCall("calc", "4*5")
    assert env.tool_call("Answer: 5") is None
    assert env.tool_call("<tool>calc 2+3</tool>") is None  # no colon: not a call


def test_calculator_env_rewards_a_correct_answer_only_after_a_tool_call():
    prompt = Prompt("p", "Compute 12 * 34.", "408")
    lazy = CalculatorEnv(prompt, seed=0)
    assert lazy.step("Answer: 408") == EnvStep(done=True, reward=0.0, reason="correct without calling the calculator")

    env = CalculatorEnv(prompt, seed=0)
    assert env.tool_result(ToolCall("calc", "12 * 34"), "408") == EnvStep(observation="<result>408</result>")
    assert env.step("Answer: 407") == EnvStep(done=True, reward=0.0, reason="wrong answer")
    env = CalculatorEnv(prompt, seed=0)
    unknown = env.tool_result(ToolCall("python", "12 * 34"), "")
    assert "no tool 'python'" in unknown.observation and not unknown.done and env.calls == 0
    env.tool_result(ToolCall("calc", "12 * 34"), "408")
    assert env.step("The result is 408. Answer: 408") == EnvStep(done=True, reward=1.0, reason="correct")


def test_guess_number_answers_higher_lower_and_ends_when_found():
    env = GuessNumberEnv(Prompt("g", GuessNumberEnv.PROMPT.format(low=1, high=20), "13"), seed=0)
    assert env.step("I guess 7") == EnvStep(observation="higher")
    assert env.step("15") == EnvStep(observation="lower")
    assert env.step("no idea") == EnvStep(observation="Reply with one number.")
    assert env.step("13") == EnvStep(done=True, reward=1.0, reason="found")
    secrets = [int(p.answer) for _, p in zip(range(200), guess_number_prompts(0, 1, 20))]
    assert min(secrets) >= 1 and max(secrets) <= 20 and len(set(secrets)) > 10


class Echo(Environment):
    name = "echo"

    def step(self, text: str) -> EnvStep:
        return EnvStep(done=True, reward=float(text == self.prompt.answer))


def test_environments_are_found_by_name_or_dotted_path_with_clear_errors():
    assert {"calculator", "guess_number"} <= set(registered_environments())
    assert make_environment("calculator") is CalculatorEnv
    assert make_environment("tests.test_envs.Echo") is Echo
    with pytest.raises(ValueError, match="unknown environment 'nope'; built-in: calculator"):
        make_environment("nope")
    with pytest.raises(ValueError, match="not a subclass"):
        make_environment("tests.test_envs.test_environments_are_found_by_name_or_dotted_path_with_clear_errors")
    with pytest.raises(ValueError, match="cannot import module"):
        make_environment("no_such_pkg.Env")


def test_an_episode_masks_observations_and_keeps_each_tokens_version():
    ep = Episode(prompt_ids=[1, 2, 3])
    ep.add_model_turn([10, 11, 12], [-0.1, -0.2, -0.3], [0, 0, 1], ToolCall("calc", "2+3"))
    ep.add_observation([20, 21], "<result>5</result>", tool="calc")
    ep.add_model_turn([13, 14], [-0.4, -0.5], [2, 2])
    assert ep.response_ids == [10, 11, 12, 20, 21, 13, 14]
    assert ep.loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert ep.behavior_logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert ep.token_versions == [0, 0, 1, -1, -1, 2, 2]
    assert ep.next_input() == [1, 2, 3, 10, 11, 12, 20, 21, 13, 14]
    assert ep.sampled_versions() == [0, 0, 1, 2, 2] and ep.model_turns() == 2
    assert [(t.role, t.start, t.end, t.tool) for t in ep.turns] == [
        ("model", 0, 3, "calc"), ("observation", 3, 5, "calc"), ("model", 5, 7, None)]
    with pytest.raises(ValueError, match="one log-prob and one version per token"):
        ep.add_model_turn([1, 2], [-0.1], [0, 0])


def test_observation_tokens_continue_the_chat_template_after_the_models_eos(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    first = [{"role": "user", "content": "Guess a number."}]
    prompt = tok.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    model_turn = tok("7", add_special_tokens=False).input_ids + [tok.eos_token_id]  # as sampled: ends with its EOS
    obs = observation_ids(tok, "higher", chat=True)
    episode = tok(prompt, add_special_tokens=False).input_ids + model_turn + obs
    whole = first + [{"role": "assistant", "content": "7"}, {"role": "user", "content": "higher"}]
    # the appended tokens render exactly as the template renders the whole conversation
    assert tok.decode(episode) == tok.apply_chat_template(whole, add_generation_prompt=True, tokenize=False)
    assert observation_ids(tok, "higher", chat=False) == tok("higher", add_special_tokens=False).input_ids
