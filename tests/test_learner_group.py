"""L=2 learner workers (two Ray actors, one gloo group) make the update L=1 makes on the same batch."""
import pytest
import torch

from actors.learner import Learner
from asyncrl.core.weights import free_port
from tests.test_learner import fake_samples, learner

# mini_batches=2 checks that each worker takes its shard of every mini-batch; micro_batch_size=3
# that accumulation inside a worker composes with the all-reduce across workers
CASES = {
    "grpo": ["learner.mini_batches=2", "learner.micro_batch_size=3"],
    "ppo": ["algorithm.name=ppo", "learner.micro_batch_size=5", "algorithm.loss_agg=seq_mean"],
    "lora": ["learner.lora.rank=4", "learner.lora.alpha=8", "learner.micro_batch_size=3"],  # only the adapter is all-reduced
}
LR = 1e-5


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_learner_workers_match_one(ray_local, random_model_dir, case):
    overrides = [f"learner.lr={LR}", "learner.num_workers=2", *CASES[case]]
    single = learner(random_model_dir, *overrides)
    single_metrics = [single.train_step(fake_samples(), version=0) for _ in range(2)]
    expected = dict(single.model.named_parameters())

    cfg = single.cfg
    actors = [ray_local.remote(Learner).options(num_cpus=1).remote(cfg, random_model_dir, rank) for rank in range(2)]
    port = free_port()
    assert all(ray_local.get([a.init_learner_group.remote("127.0.0.1", port, rank, 2) for rank, a in enumerate(actors)]))
    for _ in range(2):
        group_metrics = ray_local.get([a.train_step.remote(fake_samples(), 0) for a in actors])
    ranks = ray_local.get([a.parameters_and_grads.remote() for a in actors])
    for name, param in expected.items():
        w0, g0 = ranks[0][name]
        w1, g1 = ranks[1][name]
        assert torch.equal(w0, w1), f"{name}: the two workers diverged"
        if param.grad is None:  # frozen (LoRA's base weights): no gradient on either side
            assert g0 is None and not param.requires_grad, name
            continue
        torch.testing.assert_close(g0, param.grad, atol=1e-6, rtol=1e-4)  # the batch gradient (last mini-batch)
        # Adam moves each weight by about lr per step: fp32 noise in a near-zero gradient can flip
        # one element's step, so weights agree to 2 lr per step, not to rounding
        torch.testing.assert_close(w0, param.detach(), atol=4 * LR, rtol=0)
    for key in ("loss/policy", "is_ratio/mean", "kl/ref", "reward/mean"):
        assert group_metrics[0][key] == pytest.approx(single_metrics[-1][key], rel=1e-4, abs=1e-6), key
    assert group_metrics[0]["is_ratio/max"] == pytest.approx(single_metrics[-1]["is_ratio/max"], rel=1e-5)
    for a in actors:
        ray_local.kill(a)
