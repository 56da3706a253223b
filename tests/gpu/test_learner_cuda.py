"""The FSDP2 learner on CUDA/NCCL: what these CPU machines cannot run. Skipped without CUDA.

Runs on a machine with PyTorch (and transformers, peft, pydantic, pyyaml) but neither vLLM nor Ray: the learner
is a plain class, imported without Ray. Run it with the benchmark as one script: `tests/gpu/run.sh`.
"""
import pytest
import torch

from asyncrl.actors.learner import Learner
from asyncrl.core.config import load_config
from tests.test_learner import fake_samples, weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def cuda_learner(model_dir, *overrides):
    cfg = load_config(None, ["rollout.group_size=4", "learner.batch_size=16", "learner.device=cuda", "learner.backend=nccl",
                             "learner.num_gpus=1", "learner.grad_clip=0", *overrides])
    return Learner(cfg, model_dir)


@pytest.mark.parametrize("options", [[], ["learner.gradient_checkpointing=true"], ["learner.offload=true"]],
                         ids=["plain", "checkpointing", "offload"])
def test_a_bf16_step_on_cuda_moves_the_fp32_master_weights(random_model_dir, options):
    lrn = cuda_learner(random_model_dir, "model.dtype=bfloat16", "learner.lr=1e-6", *options)
    before, sent = weights(lrn), dict(lrn.gathered_weights())
    shard = next(lrn.model.parameters()).to_local()
    assert shard.dtype == torch.float32 and shard.device.type == ("cpu" if "learner.offload=true" in options else "cuda")
    assert all(t.dtype == torch.bfloat16 for t in sent.values())
    metrics = [lrn.train_step(fake_samples(), version=step) for step in range(3)]
    after = weights(lrn)
    moved = sum(int((a != b).sum()) for a, b in zip(before, after)) / sum(a.numel() for a in before)
    assert moved > 0.9 and max(float((a - b).abs().max()) for a, b in zip(before, after)) < 1e-5
    assert any(not torch.equal(t, dict(lrn.gathered_weights())[n]) for n, t in sent.items())  # the engines get the change
    assert all(m["learner/peak_mem_gb"] > 0 for m in metrics)
    assert metrics[-1]["learner/peak_mem_gb"] == pytest.approx(torch.cuda.max_memory_allocated() / 1e9)


def test_the_memory_estimate_refuses_what_cannot_fit(random_model_dir, monkeypatch):
    from asyncrl.core import memory

    monkeypatch.setattr(memory, "device_capacity_gb", lambda device: 1e-6)
    with pytest.raises(MemoryError, match="learner.offload=true"):
        cuda_learner(random_model_dir)
