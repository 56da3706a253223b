"""The environment plugin API and an episode's token bookkeeping (asyncrl.core.envs): pure logic, no engine."""
from __future__ import annotations

import dataclasses
import random

import pytest
from transformers import AutoTokenizer

from asyncrl.core.config import load_config
from asyncrl.core.chat import observation_ids
from asyncrl.core.envs import arithmetic_problem, calculator, CalculatorEnv, Environment, EnvStep, GuessNumberEnv, make_environment, registered_environments, ToolCall
from asyncrl.core.episode import Episode, EpisodeLimits, EpisodeRun
from asyncrl.core.prompts import Prompt
from asyncrl.core.tasks import make_task
from tests.envs_fixture import ScriptedEnv


def task_of(*overrides: str):
    return make_task(load_config(None, ["model.path=/x", *overrides]).task, seed=0)


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
    task = task_of("task.name=calculator", "task.steps=3", "task.eval_size=5")
    prompts = [p for _, p in zip(range(3), task.train_prompts(0))]
    assert prompts == [p for _, p in zip(range(3), task_of("task.name=calculator", "task.steps=3").train_prompts(0))]
    assert next(task.train_prompts(0, start=2)) == prompts[2]  # a data cursor skips exactly that many
    assert len(task.eval_prompts()) == 5 and not {p.text for p in task.eval_prompts()} & {p.text for p in prompts}
    for p in prompts:
        expression = p.text.split("Compute ", 1)[1].split(". Do not", 1)[0]
        assert calculator(expression) == p.answer


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
    secrets = [int(p.answer) for _, p in zip(range(200), task_of("task.name=guess_number", "task.high=20").train_prompts(0))]
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
    # a turn that ended at a stop string has no EOS of its own: the observation closes it with the template's
    unclosed = tok("<tool>calc: 2+3</tool>", add_special_tokens=False).input_ids
    episode = tok(prompt, add_special_tokens=False).input_ids + unclosed + observation_ids(tok, "5", chat=True, after_eos=False)
    whole = first + [{"role": "assistant", "content": "<tool>calc: 2+3</tool>"}, {"role": "user", "content": "5"}]
    assert tok.decode(episode) == tok.apply_chat_template(whole, add_generation_prompt=True, tokenize=False)


EOS = 99


def scripted_run(env=None, max_turns=4, max_tokens=40, turn_tokens=8) -> EpisodeRun:
    """An episode whose observations are one token per character (a stand-in tokenizer: pure logic)."""
    def observe(text: str, after_eos: bool) -> list[int]:
        return ([] if after_eos else [EOS]) + [ord(c) for c in text]

    env = env or ScriptedEnv(Prompt("p", "1+1=", "2"), seed=0)
    return EpisodeRun(env, [1, 2], EpisodeLimits(max_turns, max_tokens, turn_tokens), observe,
                      lambda ids: "".join(chr(i) for i in ids if i != EOS), frozenset({EOS}))


def test_an_episode_runs_model_turns_tools_and_observations_with_only_sampled_tokens_in_the_loss():
    run = scripted_run()
    call = run.model_turn([65, 66, EOS], [-0.1, -0.2, -0.3], [0, 0, 0])
    assert call == ToolCall("tool", "12") and run.pending == call and not run.done
    run.tool_done("21")
    assert run.episode.next_input() == [1, 2, 65, 66, EOS, ord("2"), ord("1")]
    assert run.model_turn([67, 68], [-0.4, -0.5], [1, 1]) is None  # cut at its limit, no EOS: the observation closes it
    assert run.episode.response_ids[-3:] == [EOS, ord("3"), ord("4")]
    assert run.model_turn([69, EOS], [-0.6, -0.7], [1, 1]) is None
    assert run.done and run.finish_reason == "stop" and run.end == EnvStep(done=True, reward=0.0, reason="scripted end")
    ep = run.episode
    sampled = [65, 66, EOS, 67, 68, 69, EOS]
    assert [t for t, m in zip(ep.response_ids, ep.loss_mask) if m] == sampled  # the loss sees exactly these
    assert all(ep.behavior_logprobs[i] == 0.0 and ep.token_versions[i] == -1 for i, m in enumerate(ep.loss_mask) if not m)
    assert [(t.role, t.end - t.start) for t in ep.turns] == [("model", 3), ("observation", 2), ("model", 2), ("observation", 3), ("model", 2)]
    assert ep.sampled_versions() == [0, 0, 0, 1, 1, 1, 1]


def test_an_episode_ends_at_its_turn_limit_its_token_budget_or_a_failed_tool():
    run = scripted_run(max_turns=2)
    run.model_turn([65, EOS], [-0.1, -0.1], [0, 0])
    run.tool_done("21")
    run.model_turn([66, EOS], [-0.1, -0.1], [0, 0])
    assert run.finish_reason == "max_turns" and run.end.reason == "env.max_turns=2 reached" and run.end.reward == 0.0

    run = scripted_run(max_turns=1)  # a tool call on the last turn is not run: the model could never read its result
    assert run.model_turn([65, EOS], [-0.1, -0.1], [0, 0]) is None and run.pending is None
    assert run.finish_reason == "max_turns" and [t.role for t in run.episode.turns] == ["model"]

    run = scripted_run(max_tokens=6, turn_tokens=8)
    assert run.turn_budget() == 6
    run.model_turn([65, 66, 67, EOS], [-0.1] * 4, [0] * 4)
    assert run.turn_budget() == 2
    run.tool_done("2109")  # 4 more tokens would leave no room for the model
    assert run.finish_reason == "length" and run.end.reason == "env.max_episode_tokens=6 used"
    assert len(run.episode.response_ids) == 4

    run = scripted_run()
    run.model_turn([65, EOS], [-0.1, -0.1], [0, 0])
    run.tool_failed("tool 'tool' timed out after 1 s")
    assert run.finish_reason == "tool_error" and run.end.reason == "tool 'tool' timed out after 1 s" and run.pending is None


def test_a_call_of_a_tool_the_environment_lacks_is_answered_without_running_anything():
    run = scripted_run(env=CalculatorEnv(Prompt("c", "Compute 2 + 3.", "5"), seed=0), max_tokens=200)
    text = [ord(c) for c in "<tool>python: 2+3</tool>"]
    assert run.model_turn(text, [-0.1] * len(text), [0] * len(text)) is None and not run.done
    assert "no tool 'python'" in run.episode.turns[-1].text


def test_env_config_is_validated_at_load():
    from asyncrl.core.config import ConfigError

    cfg = load_config(None, ["model.path=/x", "model.max_model_len=512", "env.name=calculator", "task.name=calculator"])
    assert cfg.env.max_turns == 4 and cfg.env.tool_timeout_s == 10.0
    for overrides, message in (
        (["env.name=nope"], "env.name: unknown environment 'nope'"),
        (["env.name=calculator", "env.max_episode_tokens=64"], "model.max_model_len: must exceed env.max_episode_tokens"),
        (["env.name=calculator", "model.max_model_len=512", "reward.num_workers=1"], "reward.num_workers: must be 0 with env.name"),
        (["env.max_turns=0"], "env.max_turns: input should be greater than or equal to 1"),
        (["env.tool_timeout_s=0"], "env.tool_timeout_s: input should be greater than 0"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, ["model.path=/x", *overrides])


def test_a_transcript_shows_each_turn_with_its_writer_versions_and_tokens():
    from asyncrl.analysis.runs import transcript
    from asyncrl.core.schema import new_sample

    run = scripted_run()
    run.model_turn([65, EOS], [-0.1, -0.1], [3, 3])
    run.tool_done("21")
    run.model_turn([66, EOS], [-0.1, -0.1], [3, 4])
    run.model_turn([67, EOS], [-0.1, -0.1], [4, 4])
    ep = run.episode
    record = new_sample(sample_id="r-w0-g0-1", prompt_text="1+1=", prompt_ids=ep.prompt_ids, response_ids=ep.response_ids,
                        token_versions=ep.token_versions, loss_mask=ep.loss_mask, turns=[dataclasses.asdict(t) for t in ep.turns],
                        reward=run.end.reward, finish_reason=run.finish_reason, episode_end=run.end.reason, status="consumed")
    assert transcript(record).splitlines() == [
        "episode r-w0-g0-1  status consumed  reward 0.0  finish stop (scripted end)",
        "[prompt, 2 tok] 1+1=",
        "[model v3 -> tool tool, 2 tok] A",
        "[tool tool, 2 tok] 21",
        "[model v3-v4, 2 tok] B",
        "[environment, 2 tok] 34",
        "[model v4, 2 tok] C",
    ]
