"""The learner's per-rank memory estimate (asyncrl/core/memory.py): hand-derived figures, counts from the config
alone, and the refusal that names what would fit."""
import pytest

from asyncrl.core import memory as mem
from asyncrl.core.config import load_config
from tests.test_learner import learner

GB = 1e9


def test_estimate_by_hand():
    counts = mem.ModelCounts(params=1_000_000_000, trainable=1_000_000_000, largest_layer=50_000_000)
    one = mem.estimate(counts, world=1, compute_bytes=2, reference=True, offload=False)
    # fp32 master 4 GB, grads 4 GB, Adam 8 GB, bf16 reference 2 GB, two layers in flight at (2 + 4) bytes: 0.6 GB
    assert (one.params, one.grads, one.optimizer, one.reference, one.in_flight) == pytest.approx((4, 4, 8, 2, 0.6))
    assert one.device == pytest.approx(18.6) and one.host == 0
    four = mem.estimate(counts, world=4, compute_bytes=2, reference=True, offload=False)
    assert four.sharded == pytest.approx(one.sharded / 4) and four.in_flight == one.in_flight  # a layer is whole
    off = mem.estimate(counts, world=4, compute_bytes=2, reference=True, offload=True)
    assert off.device == pytest.approx(0.6) and off.host == pytest.approx(4.5)
    lora = mem.estimate(mem.ModelCounts(1_000_000_000, 10_000_000, 50_000_000), 1, 2, reference=True, offload=False)
    assert lora.reference == 0 and lora.grads == pytest.approx(0.04) and lora.optimizer == pytest.approx(0.08)  # no copy


def test_refusal_names_the_numbers_and_what_would_fit():
    counts = mem.ModelCounts(params=7_000_000_000, trainable=7_000_000_000, largest_layer=200_000_000)
    est = mem.estimate(counts, 1, 2, True, False)
    alternatives = {"learner.offload=true": mem.estimate(counts, 1, 2, True, True),
                    "learner.num_workers=2": mem.estimate(counts, 2, 2, True, False)}
    # 7e9 x (4 + 4 + 8 + 2) bytes = 126 GB + 2.4 GB in flight; two workers: 63 + 2.4 GB, over 60 GB too
    with pytest.raises(MemoryError, match=r"needs 128\.4 GB per rank .* holds 60\.0 GB") as err:
        mem.check_fits(est, 60.0, alternatives)
    assert "learner.offload=true (2.4 GB)" in str(err.value) and "num_workers=2" not in str(err.value)
    mem.check_fits(mem.estimate(counts, 8, 2, True, False), 60.0, {})  # 15.75 + 2.4 GB fits


def test_counts_come_from_the_config_without_loading(random_model_dir):
    lrn = learner(random_model_dir)
    full = sum(p.numel() for p in lrn.model.parameters())
    counts = mem.model_counts(random_model_dir)
    assert counts.params == counts.trainable == full and 0 < counts.largest_layer < full
    lora_cfg = load_config(None, ["learner.lora.rank=4", "learner.lora.alpha=8"]).learner.lora
    with_lora = mem.model_counts(random_model_dir, lora_cfg)
    lora = learner(random_model_dir, "learner.lora.rank=4", "learner.lora.alpha=8")
    assert with_lora.trainable == sum(p.numel() for p in lora.model.parameters() if p.requires_grad) < full
    assert mem.model_counts(random_model_dir, critic=True).critic > 0


def test_a_learner_that_cannot_fit_fails_before_loading(random_model_dir, monkeypatch):
    monkeypatch.setattr(mem, "device_capacity_gb", lambda device: 1e-4)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(MemoryError, match="per rank on its device"):
        learner(random_model_dir)


def test_peak_memory_is_reported_per_step(random_model_dir):
    from tests.test_learner import fake_samples

    m = learner(random_model_dir).train_step(fake_samples(), version=0)
    assert 0.05 < m["learner/peak_mem_gb"] < 24  # this process's peak RSS, in GB
