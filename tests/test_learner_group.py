"""L=2 learner workers (two Ray actors, one gloo group, FSDP2) make the update L=1 makes on the same batch, each
holding half of the weights."""
import pytest
import torch

from asyncrl.actors.learner import Learner
from tests.test_learner import fake_samples, learner, long_prompt_samples, ragged_samples

# mini_batches=2 checks that each worker takes its shard of every mini-batch; micro_batch_size=3
# that accumulation inside a worker composes with the all-reduce across workers
CASES = {
    "grpo": ["learner.mini_batches=2", "learner.micro_batch_size=3"],
    "ppo": ["algorithm.name=ppo", "learner.micro_batch_size=5", "algorithm.loss_agg=seq_mean"],
    "lora": ["learner.lora.rank=4", "learner.lora.alpha=8", "learner.micro_batch_size=3"],  # only the adapter is all-reduced
    "shared_prompt": ["learner.micro_batch_size=3", "learner.pass_overhead_tokens=0"],  # see mixed_prompt_samples
}


def mixed_prompt_samples() -> list[dict]:
    """Two groups with 40-token prompts (rank 0's shard: grouped, a group's prompt once, 4 micro-batches of at most
    3) and two with 5-token prompts (rank 1's: length-sorted, 3): the workers must still run as many passes."""
    return long_prompt_samples()[:8] + ragged_samples()[8:]


SAMPLES = {"shared_prompt": mixed_prompt_samples}
LR = 1e-5


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_learner_workers_match_one(ray_local, random_model_dir, case):
    overrides = [f"learner.lr={LR}", "learner.num_workers=2", *CASES[case]]
    single = learner(random_model_dir, *overrides)
    samples = SAMPLES.get(case, fake_samples)
    single_metrics = [single.train_step(samples(), version=0) for _ in range(2)]
    expected = single.parameters_and_grads()

    cfg = single.cfg
    actors = [ray_local.remote(Learner).options(num_cpus=1).remote(cfg, random_model_dir, rank) for rank in range(2)]
    port = ray_local.get(actors[0].pick_port.remote("127.0.0.1"))  # rank 0 hosts the store on it
    assert all(ray_local.get([a.init_learner_group.remote("127.0.0.1", port, rank, 2, "asyncrl-learners-test") for rank, a in enumerate(actors)]))
    held = ray_local.get([a.held_numel.remote() for a in actors])
    assert held[0][1] == held[1][1] and held[0][0] + held[1][0] == held[0][1]  # sharded: each rank holds its part
    assert max(h for h, _ in held) <= 0.6 * held[0][1]
    for _ in range(2):
        group_metrics = ray_local.get([a.train_step.remote(samples(), 0) for a in actors])
    ranks = ray_local.get([a.parameters_and_grads.remote() for a in actors])
    for name, (param, grad) in expected.items():
        w0, g0 = ranks[0][name]
        w1, g1 = ranks[1][name]
        assert torch.equal(w0, w1), f"{name}: the two workers gathered different weights"
        if grad is None:  # frozen (LoRA's base weights): no gradient on either side
            assert g0 is None and ".lora_" not in name, name
            continue
        torch.testing.assert_close(g0, grad, atol=1e-6, rtol=1e-4)  # the batch gradient (last mini-batch)
        # Adam moves each weight by about lr per step: fp32 noise in a near-zero gradient can flip
        # one element's step, so weights agree to 2 lr per step, not to rounding
        torch.testing.assert_close(w0, param, atol=4 * LR, rtol=0)
    if single.critic is not None:  # PPO: the critic's update too
        critic = ray_local.get([a.parameters_and_grads.remote("critic") for a in actors])[0]
        for name, (param, grad) in single.parameters_and_grads("critic").items():
            torch.testing.assert_close(critic[name][1], grad, atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(critic[name][0], param, atol=4 * LR, rtol=0)
    for key in ("loss/policy", "is_ratio/mean", "kl/ref", "reward/mean"):
        assert group_metrics[0][key] == pytest.approx(single_metrics[-1][key], rel=1e-4, abs=1e-6), key
    assert group_metrics[0]["is_ratio/max"] == pytest.approx(single_metrics[-1]["is_ratio/max"], rel=1e-5)
    for a in actors:
        ray_local.kill(a)


def test_sync_from_shards_is_the_whole_model_byte_for_byte_and_checkpoints_reshard(ray_local, random_model_dir, tmp_path):
    """At world 2, what a sync sends (gathered bucket by bucket from the shards) is the model's weights in the engines'
    dtype, bit for bit; a checkpoint written at world 2 resumes at world 1 (DCP reshards) and trains on identically."""
    from transformers import AutoModelForCausalLM

    overrides = [f"learner.lr={LR}", "learner.num_workers=2", "model.dtype=bfloat16"]
    single = learner(random_model_dir, *overrides)
    actors = [ray_local.remote(Learner).options(num_cpus=1).remote(single.cfg, random_model_dir, rank) for rank in range(2)]
    port = ray_local.get(actors[0].pick_port.remote("127.0.0.1"))  # rank 0 hosts the store on it
    ray_local.get([a.init_learner_group.remote("127.0.0.1", port, rank, 2, "asyncrl-learners-test") for rank, a in enumerate(actors)])
    sent = ray_local.get([a.gathered_weights.remote() for a in actors])[0]
    plain = dict(AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).named_parameters())
    assert [n for n, _ in sent] == list(plain)
    for name, tensor in sent:
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor.view(torch.int16), plain[name].detach().to(torch.bfloat16).view(torch.int16)), name

    ray_local.get([a.train_step.remote(fake_samples(), 0) for a in actors])
    ray_local.get([a.save_checkpoint.remote(str(tmp_path)) for a in actors])
    assert single.load_checkpoint(str(tmp_path)) == 1
    group_weights = ray_local.get([a.parameters_and_grads.remote() for a in actors])[0]
    for name, (w, _) in single.parameters_and_grads().items():
        assert torch.equal(w, group_weights[name][0]), name
    m_group = ray_local.get([a.train_step.remote(fake_samples(), 1) for a in actors])[0]
    m_single = single.train_step(fake_samples(), 1)  # the Adam moments came along: the next step agrees too
    assert m_single["loss/policy"] == pytest.approx(m_group["loss/policy"], rel=1e-4, abs=1e-6)
    group_weights = ray_local.get([a.parameters_and_grads.remote() for a in actors])[0]
    for name, (w, _) in single.parameters_and_grads().items():
        torch.testing.assert_close(w, group_weights[name][0], atol=4 * LR, rtol=0)
    for a in actors:
        ray_local.kill(a)
