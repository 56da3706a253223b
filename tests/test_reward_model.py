"""task.reward=reward_model: a sequence-classification model as a batched reward, built tiny by the test."""
from __future__ import annotations

import pytest
import ray
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from asyncrl.actors.buffer import ReplayBuffer
from asyncrl.actors.reward import RewardWorker
from asyncrl.core.config import ConfigError, load_config
from asyncrl.core.reward_model import RewardModel
from asyncrl.core.scoring import ScoringProcess, reward_traits
from asyncrl.core.prompts import Prompt
from tests.test_reward_pool import GROUP, records

PROMPTS = [Prompt("a", "1+1=", "2"), Prompt("b", "12+30=", "42"), Prompt("c", "7+8=", "15")]
RESPONSES = ["2", "41 and more", ""]


@pytest.fixture(scope="module")
def classifier_dir(random_model_dir, tmp_path_factory) -> str:
    """A one-label classification head on the random tiny model, with its tokenizer."""
    out = tmp_path_factory.mktemp("reward_model")
    config = AutoConfig.from_pretrained(random_model_dir, num_labels=1)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(random_model_dir).save_pretrained(out)
    return str(out)


def reference_scores(path: str) -> list[float]:
    """The model's first logit for each prompt + response, one at a time (no padding)."""
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return [model(**tok(p.text + r, return_tensors="pt")).logits[0, 0].item() for p, r in zip(PROMPTS, RESPONSES)]


def test_the_reward_model_scores_a_padded_batch_as_each_pair_alone(classifier_dir):
    expected = reference_scores(classifier_dir)
    got = RewardModel(classifier_dir, "cpu")(PROMPTS, RESPONSES)
    assert got == pytest.approx(expected, abs=1e-5)
    assert len(set(round(v, 4) for v in got)) == 3  # a real model: different texts, different scores
    assert reward_traits("reward_model").batched


def test_the_reward_model_runs_in_the_scoring_child(classifier_dir):
    proc = ScoringProcess("reward_model", {"model_path": classifier_dir, "device": "cpu"}, 60.0)
    try:
        out = proc.score(PROMPTS, RESPONSES)
    finally:
        proc.close()
    assert [s.value for s in out] == pytest.approx(reference_scores(classifier_dir), abs=1e-5)


def test_a_reward_model_needs_a_pool_and_a_directory():
    with pytest.raises(ConfigError, match="^reward.num_workers: task.reward=reward_model scores in the reward pool"):
        load_config(None, ["task.reward=reward_model", "reward.model_path=/x"])
    with pytest.raises(ConfigError, match="^reward.model_path: must name"):
        load_config(None, ["task.reward=reward_model", "reward.num_workers=1"])


def test_a_reward_actor_scores_groups_with_the_reward_model(classifier_dir, ray_local, tmp_path):
    cfg = load_config(None, [f"rollout.group_size={GROUP}", "learner.batch_size=4", "reward.num_workers=1", "task.reward=reward_model",
                             f"reward.model_path={classifier_dir}", "reward.batch_size=8", "reward.batch_wait_s=0.5"])
    buffer = ray.remote(ReplayBuffer).remote(cfg, str(tmp_path / "traj"))
    ray.get(buffer.admit.remote(8, 0))
    actor = ray.remote(RewardWorker).remote(0, cfg, buffer)
    try:
        prompt = PROMPTS[1]
        answers = ray.get([actor.score.remote(records(k, ["41", "42", "forty-two", "42"], prompt), prompt) for k in range(2)])
        assert all(a.failures == () for a in answers)
        batch = ray.get(buffer.get_batch.remote(2, 0, 0, 5.0))
        rewards = [r["reward"] for r in batch]
        assert rewards[1] == rewards[3] == rewards[5] == rewards[7] and rewards[0] != rewards[2]
        s = ray.get(actor.stats.remote())
        assert s.scored == 3 and s.calls == 1  # 8 samples, 3 distinct responses, one forward pass
    finally:
        ray.kill(actor)
        ray.kill(buffer)
