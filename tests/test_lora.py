"""LoRA RL on the random tiny model: only the adapter trains, the reference is the adapter switched off,
and a sync sends the merged weights of the adapted layers (with their fused siblings), which the real
vLLM engine then scores exactly as the learner does."""
import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from asyncrl.core import lora as lora_lib
from asyncrl.core.config import ConfigError, load_config
from asyncrl.core.models.cache import ModelSource
from asyncrl.orchestration.controller import Controller
from tests.test_learner import fake_samples, learner
from tests.test_weight_sync import SEQ

LORA = ["learner.lora.rank=4", "learner.lora.alpha=8"]


def test_only_the_adapter_trains_and_the_reference_is_the_base_model(random_model_dir):
    lrn = learner(random_model_dir, *LORA, "learner.lora.target_modules=[q_proj, v_proj]")
    before = {n: w for n, (w, _) in lrn.parameters_and_grads().items()}
    trainable = {n for n, p in lrn.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    named = dict(lrn.model.named_parameters())  # the sharded parameters the optimizer steps
    assert {id(p) for g in lrn.opt.param_groups for p in g["params"]} == {id(named[n]) for n in trainable}
    base_lps = lrn.sequence_logprobs(SEQ)  # B = 0: the wrapped model is the base model
    for step in range(3):
        metrics = lrn.train_step(fake_samples(), version=step)
    assert metrics["kl/ref"] > 0  # the policy moved away from the reference
    changed = {n for n, (w, _) in lrn.parameters_and_grads().items() if not torch.equal(w, before[n])}
    assert changed and changed <= trainable  # the base weights are untouched
    assert any(".lora_B." in n for n in changed)
    with lrn.model.disable_adapter():
        assert lrn.sequence_logprobs(SEQ) == pytest.approx(base_lps, abs=1e-6)
    assert lrn.sequence_logprobs(SEQ) != pytest.approx(base_lps, abs=1e-3)


def test_sync_sends_adapted_layers_and_their_fused_siblings_merged(random_model_dir):
    lrn = learner(random_model_dir, *LORA, "learner.lora.target_modules=[q_proj, down_proj]")
    modules = lrn.lora_modules
    layer0 = [m for m in modules if m.startswith("model.layers.0.")]
    # q_proj brings k_proj and v_proj (vLLM's qkv_proj is loaded whole); down_proj stands alone
    assert layer0 == ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                      "model.layers.0.self_attn.v_proj", "model.layers.0.mlp.down_proj"]
    for step in range(2):
        lrn.train_step(fake_samples(), version=step)
    meta = lrn.weight_meta()
    merged = dict(lrn.gathered_weights())  # what the engine receives
    assert list(merged) == [m[0] for m in meta]  # by the names it is told
    assert set(merged) == {f"{m}.weight" for m in modules}
    # peft's own merge of an unsharded copy of the same weights
    reference = peft_copy(lrn).merge_and_unload().state_dict()
    for name, weight in merged.items():
        torch.testing.assert_close(weight, reference[name], atol=1e-6, rtol=1e-5)
    q = "model.layers.0.self_attn.q_proj.weight"
    base = lrn.parameters_and_grads()["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"][0]
    assert not torch.equal(merged[q], base)
    # the exported policy (snapshots, the final model) merges the same way
    plain = lora_lib.merge_state_dict(lrn._full_state_dict(), 8 / 4)
    for name, weight in merged.items():
        torch.testing.assert_close(weight, plain[name], atol=1e-6, rtol=1e-5)


def peft_copy(lrn):
    """An unsharded peft model holding the learner's weights (gathered)."""
    from transformers import AutoModelForCausalLM

    lora = lrn.cfg.learner.lora
    model = lora_lib.wrap(AutoModelForCausalLM.from_pretrained(lrn.model_path, dtype=torch.float32), lora.rank, lora.alpha, lora.target_modules)
    model.load_state_dict({n: w for n, (w, _) in lrn.parameters_and_grads().items()}, strict=False)
    return model


def test_lora_config_is_validated():
    with pytest.raises(ConfigError, match="learner.lora.rank"):
        load_config(None, ["learner.lora.rank=-1"])
    with pytest.raises(ConfigError, match="learner.lora.target_modules"):
        load_config(None, ["learner.lora.rank=8", "learner.lora.target_modules=[]"])
    with pytest.raises(ConfigError, match="learner.lora.ranks: unknown key"):
        load_config(None, ["learner.lora.ranks=8"])


def test_lora_sync_reaches_the_engine(ray_local, random_model_dir, tmp_path):
    cfg = load_config(None, [
        "rollout.group_size=4", "learner.batch_size=16", "learner.lr=1e-2", "learner.sync_bucket_mb=0.05",
        *LORA, "learner.lora.target_modules=[q_proj, o_proj, up_proj]", "logging.wandb=false", f"run.output_dir={tmp_path}",
    ])
    ctl = Controller(cfg, tmp_path, ModelSource(given=random_model_dir, path=random_model_dir))
    try:
        engine_before = ray.get(ctl.workers[0].sequence_logprobs.remote(SEQ))
        for step in range(2):
            ray.get(ctl.learner.train_step.remote(fake_samples(), step))
        learner_after = ray.get(ctl.learner.sequence_logprobs.remote(SEQ))
        sync = ctl.sync_weights()
        ray.get(ctl.learner.train_step.remote(fake_samples(), 2))  # the adapter moves on while the version is in flight
        ctl.settle_weights()
        engine_after = ray.get(ctl.workers[0].sequence_logprobs.remote(SEQ))
        assert max(abs(a - b) for a, b in zip(engine_after, learner_after)) < 1e-3
        assert max(abs(a - b) for a, b in zip(engine_after, engine_before)) > 1e-3
        meta = ray.get(ctl.learner.weight_meta.remote())
        assert sync["bytes"] == sum(4 * torch.Size(shape).numel() for _, _, shape in meta)
        assert len(meta) == 3 * 6  # q, k, v, o, gate, up of each of the 3 layers: not down_proj, norms, embeddings
        base = dict(AutoModelForCausalLM.from_pretrained(random_model_dir).named_parameters())
        unsent = sum(p.numel() for n, p in base.items() if not n.endswith(("_proj.weight",)) or "down_proj" in n)
        assert sync["bytes"] == 4 * (sum(p.numel() for p in base.values()) - unsent)
    finally:
        ctl.shutdown()


def test_lora_with_bf16_compute_trains_when_the_reference_pass_comes_first(random_model_dir):
    """The reference (adapter off) is the first forward of a step; with bf16 compute FSDP2 must still reduce the
    adapter's gradients in fp32 into its fp32 master (a bf16 gradient was once assigned to it: a RuntimeError)."""
    lrn = learner(random_model_dir, *LORA, "model.dtype=bfloat16", "learner.lr=1e-3")
    before = {n: w for n, (w, _) in lrn.parameters_and_grads().items() if ".lora_B." in n}
    metrics = lrn.train_step(fake_samples(), version=0)
    assert "kl/ref" in metrics  # the reference pass ran
    after = lrn.parameters_and_grads()
    assert all(after[n][1].dtype == torch.float32 for n in before)
    assert any(not torch.equal(after[n][0], w) for n, w in before.items())
