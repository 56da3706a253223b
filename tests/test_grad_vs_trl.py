"""bench/grad_vs_trl.py's pure parts (no TRL, no model): the comparison math, the sanity bound, TRL's advantage and
importance-ratio formulas, the choice of samples and the table."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import grad_vs_trl as g  # noqa: E402


def test_importing_the_benchmark_pulls_neither_trl_nor_torch():
    probe = "import sys, grad_vs_trl; print(sorted(m for m in ('trl', 'torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=BENCH, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cosine_and_norm_ratio_on_hand_made_vectors():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])
    assert g.cosine(a, b) == pytest.approx(1 / math.sqrt(2))
    assert g.norm_ratio(a, b) == pytest.approx(1 / math.sqrt(2))
    assert g.cosine(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 6.0])) == pytest.approx(1.0, abs=1e-15)
    assert g.norm_ratio(torch.tensor([2.0, 4.0, 6.0]), torch.tensor([1.0, 2.0, 3.0])) == pytest.approx(2.0)
    assert g.cosine(a, -a) == pytest.approx(-1.0)
    assert math.isnan(g.cosine(a, torch.zeros(2)))


def test_cosine_of_near_equal_float32_vectors_stays_at_most_1():
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    y = x * (1 + 1e-7)
    assert g.cosine(x, y) <= 1.0 + 1e-15 and g.cosine(x, y) == pytest.approx(1.0, abs=1e-12)


def test_compare_over_named_tensors():
    a = {"l.lora_A": torch.zeros(2, 2), "l.lora_B": torch.tensor([[1.0, 0.0], [0.0, 1.0]]), "extra": torch.ones(1)}
    b = {"l.lora_A": torch.zeros(2, 2), "l.lora_B": torch.tensor([[2.0, 0.0], [0.0, 2.0]])}
    c = g.compare(a, b)
    assert c["cosine"] == pytest.approx(1.0) and c["norm_ratio"] == pytest.approx(0.5) and c["rel_diff"] == pytest.approx(0.5)
    assert c["norm_a"] == pytest.approx(math.sqrt(2)) and c["norm_b"] == pytest.approx(math.sqrt(8))
    assert c["by_kind"]["lora_A"] is None and c["by_kind"]["lora_B"] == {"cosine": pytest.approx(1.0), "norm_ratio": pytest.approx(0.5)}
    assert c["tensors"] == 2 and c["only_a"] == ["extra"] and c["only_b"] == []
    assert (c["nonzero_a"], c["nonzero_b"], c["same_nonzero"]) == (2, 1, False)
    json.dumps(c)  # goes into the record as it is


@pytest.mark.parametrize("cos, ratio, broken", [
    (0.99997, 1.0003, []), (0.999, 0.99, []), (0.999, 1.01, []),
    (0.998, 1.0, ["cosine"]), (1.0, 1.02, ["norm ratio"]), (0.5, 0.98, ["cosine", "norm ratio"]),
    (math.nan, math.nan, ["cosine", "norm ratio"]),
])
def test_the_sanity_bound(cos, ratio, broken):
    failures = g.bound_failures(cos, ratio)
    assert len(failures) == len(broken) and all(word in f for word, f in zip(broken, failures))


def test_trl_advantages_per_group_with_its_eps():
    rewards = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    groups = ["a", "b", "a", "b", "a", "b", "a", "b"]  # interleaved: by id, not by position
    adv = g.trl_advantages(rewards, groups)
    std_a = torch.tensor([0.0, 0.0, 1.0, 0.0]).std().item()  # unbiased, as TRL's nanstd
    assert adv[4].item() == pytest.approx(0.75 / (std_a + 1e-4)) and adv[0].item() == pytest.approx(-0.25 / (std_a + 1e-4))
    std_b = torch.tensor([1.0, 1.0, 0.0, 0.0]).std().item()
    assert adv[1].item() == pytest.approx(0.5 / (std_b + 1e-4)) and adv[5].item() == pytest.approx(-0.5 / (std_b + 1e-4))
    assert g.trl_advantages(torch.ones(4), ["a"] * 4).abs().max().item() == 0.0  # no variance: no advantage
    assert g.trl_advantages(rewards, groups, scale=False)[4].item() == pytest.approx(0.75)


def test_trl_sequence_mask_importance_ratio():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    sampling = torch.tensor([[-1.1, -2.1, 0.0], [-1.0, float("nan"), -1.0], [-3.0, -3.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    ratio = g.trl_is_ratio(old, sampling, mask, None, 3.0)
    assert ratio.shape == (3, 1)
    assert ratio[0, 0].item() == pytest.approx(math.exp(0.2))  # the masked token does not count
    assert ratio[1, 0].item() == pytest.approx(1.0)  # a NaN difference counts 0
    assert ratio[2, 0].item() == 0.0  # exp(4) > 3: masked
    assert g.trl_is_ratio(old, sampling, mask, 1.1, None)[0, 0].item() == pytest.approx(math.exp(0.2))
    assert g.trl_is_ratio(old, sampling, mask, 1.5, None)[0, 0].item() == 0.0


def test_trl_num_items_makes_its_normaliser_the_update_tokens():
    assert g.trl_num_items(377, 4, 4) == 377  # one update per generation
    assert g.trl_num_items(732, 16, 4) == 2928  # x accumulation / steps_per_generation = 732
    assert g.trl_num_items(732, 16, 4) * 4 / 16 == 732


def rows(groups: int, size: int, version: int = 0, prefix: str = "r-w0-g") -> list[dict]:
    return [{"group_id": f"{prefix}{k}", "sample": i, "policy_version_start": version, "policy_version_end": version}
            for k in range(groups) for i in range(size)]


def test_generation_takes_whole_groups_of_the_initial_policy_in_store_order():
    store = rows(1, 2, 1, "r-w0-old") + [r for r in rows(4, 2) if r["group_id"] != "r-w0-g1"] + rows(2, 2)[2:] + rows(1, 1, 0, "r-w0-part")
    picked = g.generation(store, 2, 6)
    assert [r["group_id"] for r in picked] == ["r-w0-g0"] * 2 + ["r-w0-g2"] * 2 + ["r-w0-g3"] * 2
    assert [r["group_id"] for r in g.generation(store, 2, 8)][-2:] == ["r-w0-g1"] * 2
    with pytest.raises(SystemExit, match="4 whole groups of 2 samples of the initial policy"):
        g.generation(store, 2, 10)
    with pytest.raises(SystemExit, match="whole groups"):
        g.generation(store, 2, 3)


def test_first_groups_by_group_number_in_store_order():
    samples = [r for k in (0, 10, 2, 1) for r in rows(11, 2) if r["group_id"] == f"r-w0-g{k}"]
    picked = g.first_groups(samples, 2)
    assert [(r["group_id"], r["sample"]) for r in picked] == [("r-w0-g0", 0), ("r-w0-g0", 1), ("r-w0-g1", 0), ("r-w0-g1", 1)]
    assert [r["group_id"] for r in g.first_groups(samples, 3)].count("r-w0-g10") == 0


def test_missing_trajectories_fail_with_a_message(tmp_path):
    with pytest.raises(SystemExit, match="no trajectories at"):
        g.read_samples(tmp_path / "nowhere")


def test_sample_rows_align_the_two_sides_token_weights():
    samples = [{"prompt_ids": [1, 2, 3], "response_ids": [4, 5], "reward": 1.0, "finish_reason": "stop"},
               {"prompt_ids": [1], "response_ids": [6, 7, 8], "reward": 0.0, "finish_reason": "length"}]
    w_a = torch.zeros(2, 4, dtype=torch.float64)
    w_a[0, 2:4] = torch.tensor([0.1, 0.2])  # the positions that predict the answer: prompt length - 1 on
    w_a[1, 0:3] = torch.tensor([0.3, 0.3, 0.3])
    w_t = torch.tensor([[0.1, 0.25, 0.0], [0.3, 0.3, 0.3]])
    out = g.sample_rows(samples, w_a, w_t, torch.tensor([1.0, -1.0]), torch.tensor([0.9, -0.9]), torch.tensor([1.0, 0.0]))
    assert out[0]["sum_w_asyncrl"] == pytest.approx(0.3) and out[0]["sum_w_trl"] == pytest.approx(0.35)
    assert out[0]["max_abs_w_diff"] == pytest.approx(0.05) and out[1]["max_abs_w_diff"] == pytest.approx(0.0, abs=1e-7)
    assert (out[1]["tokens"], out[1]["finish"], out[1]["adv_trl"], out[1]["is_ratio_trl"]) == (3, "length", pytest.approx(-0.9), 0.0)


def record() -> dict:
    grads_a = {"m.layers.0.lora_A": torch.zeros(2), "m.layers.0.lora_B": torch.tensor([1.0, 2.0])}
    grads_t = {"m.layers.0.lora_A": torch.zeros(2), "m.layers.0.lora_B": torch.tensor([1.0, 2.001])}
    c = g.compare(grads_a, grads_t)
    samples = [{"reward": 1.0, "finish": "stop", "tokens": 7, "adv_asyncrl": 1.62018, "adv_trl": 1.61984, "is_ratio_trl": 0.99999,
                "sum_w_asyncrl": -0.0300830, "sum_w_trl": -0.0300764, "max_abs_w_diff": 9.8e-7}]
    one = {"groups": ["r-w0-g0", "r-w0-g1"], "tokens": 377, "lora_b_std": 0.0, "share_prompt": True, "trl_num_items": 377, "trl": {},
           "compare": {"asyncrl_vs_trl": c, "plain_vs_trl": c, "shared_vs_plain": c, "trl_orders": c},
           "loss": {"asyncrl": 0.133225, "asyncrl_plain": 0.133225, "trl": 0.133194, "trl_arrival": 0.133194},
           "max_abs_w_trl": 0.012, "samples": samples, "wall_s": 70.0}
    four = {"samples": 64, "lr": 5e-4, "grad_clip": 1.0, "update_tokens": [732, 557, 724, 557], "generation_tokens": 2570,
            "steps_per_generation": 16, "accumulation": 4, "dapo_normaliser": 642.5, "asyncrl_grad_norms": [0.147, 0.0769, 0.121, 0.113],
            "asyncrl_metrics": {}, "trl": {}, "dapo": {"grad_norms": [0.167, 0.0667, 0.137, 0.0973], "compare": c},
            "per_update": {"grad_norms": [0.147, 0.0769, 0.121, 0.113], "compare": c}, "wall_s": 250.0}
    return {"config": "configs/smollm2_word_problems.yaml", "trajectories": "bench/work/run/trajectories", "trl_version": "1.16.0",
            "overrides": ["model.dtype=float32", "learner.lr=0.0005"], "bound": {"cosine_min": 0.999, "norm_ratio": [0.99, 1.01]},
            "failures": [], "one_update": one, "four_updates": four}


def test_render_the_record():
    data = json.loads(json.dumps(record()))  # as the record is read back
    text = g.render(data)
    c = data["one_update"]["compare"]["asyncrl_vs_trl"]
    assert text.startswith("asyncrl's learner against TRL 1.16.0's GRPOTrainer") and "`smollm2_word_problems.yaml` (model.dtype=float32" in text
    assert "**One update** of 1 samples (groups r-w0-g0, r-w0-g1; 377 answer tokens; LoRA B 0, the fresh adapter)" in text
    assert f"| **asyncrl vs TRL** | {c['cosine']:.6f} | {1 - c['cosine']:.1e} | {c['norm_ratio']:.5f} |" in text
    assert "Loss: asyncrl 0.133225, TRL 0.133194." in text and "asyncrl 1, TRL 1 of 2 (the same ones; by kind: lora_B 1.000000)." in text
    assert "| 0 | 1 | stop | 7 | 1.62018 | 1.61984 | 0.99999 | -3.008300e-02 | -3.007640e-02 | 9.8e-07 |" in text
    assert "**4 updates** of 16 samples on a generation of 64" in text and "\"dapo\" as shipped: the generation's tokens / 4 (642.5) each update" in text
    assert "| 0.1670, 0.0667, 0.1370, 0.0973 |" in text and "the updates' tokens 732, 557, 724, 557." in text
    assert text.endswith("cosine ≥ 0.999, norm ratio in [0.99, 1.01]: **held**.\n")
    assert "| TRL's normaliser | cosine | 1 − cosine | norm ratio | relative difference | norms | by kind | TRL's gradient norms |" in text
    assert all(line.count("|") in (0, 7, 9, 11) for line in text.splitlines()), "a table row with the wrong number of cells"
