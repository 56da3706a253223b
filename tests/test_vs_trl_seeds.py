"""bench/vs_trl_seeds.py: seed-level medians of vs_trl runs, from synthetic results (no runs)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import vs_trl_seeds  # noqa: E402


def result(seed: int, asyncrl_s: float | None, trl_s: float | None, threshold: float = 0.4) -> dict:
    side = lambda s, rate: {"time_to_threshold": None if s is None else {"train_s": s, "step": 10}, "samples_per_s": rate,  # noqa: E731
                            "points": [{"step": 0, "accuracy": 0.3}, {"step": 10, "accuracy": 0.3 + rate / 10}]}
    return {"threshold": threshold, "split": "test", "config": "configs/x.yaml", "trl_config": "configs/x_sync.yaml",
            "overrides": [f"run.seed={seed}"], "asyncrl": side(asyncrl_s, 0.9), "trl_vllm": side(trl_s, 0.5)}


def test_medians_and_ranges_over_seeds_with_a_seed_that_never_reached_it():
    data = vs_trl_seeds.summarize([result(0, 100, 300), result(1, 120, None), result(2, 90, 200)])
    text = vs_trl_seeds.render(data)
    assert "| seconds to the threshold | 100 (90–120) | 300 (200–not reached) |" in text
    assert "| trained samples/s | 0.90 (0.90–0.90) | 0.50 (0.50–0.50) |" in text
    # speedups in the two seeds where both reached it: 3.0 and 2.22; an even count takes the lower median
    assert "after training (2 of 3): **2.22 (2.22–3.00)**" in text and "untrained model" not in text
    # samples/s 0.9 against 0.5 in every seed, whether or not the threshold was reached
    assert data["rate_ratio_over"]["trl_vllm"] == pytest.approx([1.8, 1.8, 1.8])
    assert "asyncrl / TRL + vLLM colocate, trained samples/s, every seed (3): **1.80 (1.80–1.80)**" in text


def test_runs_of_different_protocol_steps_are_refused():
    with pytest.raises(ValueError, match="differ in threshold"):
        vs_trl_seeds.summarize([result(0, 100, 300), result(1, 100, 300, threshold=0.5)])
    other = result(1, 100, 300)
    del other["trl_vllm"]
    with pytest.raises(ValueError, match="same sides"):
        vs_trl_seeds.summarize([result(0, 100, 300), other])


def test_the_synchronous_side_has_its_column_and_speedup():
    runs = []
    for seed, (a, s) in enumerate([(100, 150), (120, 130), (90, 200)]):
        r = result(seed, a, 300)
        r.update(sync_config="configs/x_sync.yaml", sync={"time_to_threshold": {"train_s": s, "step": 8}, "samples_per_s": 0.7,
                                                          "points": [{"step": 0, "accuracy": 0.3}, {"step": 8, "accuracy": 0.29}]})
        runs.append(r)
    text = vs_trl_seeds.render(vs_trl_seeds.summarize(runs))
    assert "| | asyncrl | asyncrl, synchronous | TRL + vLLM colocate |" in text
    assert "| seconds to the threshold | 100 (90–120) | 150 (130–200) | 300 (300–300) |" in text
    # speedups over the synchronous side: 1.5, 1.083, 2.22 -> median 1.5
    assert "asyncrl / asyncrl, synchronous, time to the threshold, seeds where both reached it after training (3 of 3): **1.50 (1.08–2.22)**" in text
    other = dict(runs[1], sync_config="configs/y_sync.yaml")
    with pytest.raises(ValueError, match="differ in sync_config"):
        vs_trl_seeds.summarize([runs[0], other])


def test_a_seed_whose_untrained_model_is_already_at_the_threshold_times_nothing():
    """The threshold is fixed on the dev problems; a seed's test problems may put the untrained model at it already:
    every side then reaches it at 0 s, which is no speedup of anyone's."""
    start = result(1, 0.0, 0.0)
    for side in ("asyncrl", "trl_vllm"):
        start[side]["time_to_threshold"]["step"] = 0
    data = vs_trl_seeds.summarize([result(0, 100, 300), start, result(2, 90, 200)])
    assert data["at_start"] == [1] and data["speedup_over"]["trl_vllm"][1] is None
    text = vs_trl_seeds.render(data)
    assert "reached it after training (2 of 3): **2.22 (2.22–3.00)**" in text
    assert "In 1 of 3 seeds the untrained model was already at the threshold" in text


def test_final_accuracy_and_its_gain_over_the_untrained_model_per_side():
    """What each side learned from its samples is reported whether or not it reached the threshold."""
    runs = [result(seed, 100, None) for seed in range(3)]
    runs[1]["trl_vllm"]["points"] = [{"step": 10, "accuracy": 0.5}, {"step": 0, "accuracy": 0.32}]  # any order
    data = vs_trl_seeds.summarize(runs)
    assert [s["final_accuracy"] for s in data["sides"]["trl_vllm"]] == pytest.approx([0.35, 0.5, 0.35])
    assert [s["gain"] for s in data["sides"]["trl_vllm"]] == pytest.approx([0.05, 0.18, 0.05])
    text = vs_trl_seeds.render(data)
    assert "| test accuracy at the last snapshot | 0.390 (0.390–0.390) | 0.350 (0.350–0.500) |" in text
    assert "| its gain over the model before training | +0.090 (+0.090–+0.090) | +0.050 (+0.050–+0.180) |" in text
    runs[2]["asyncrl"]["points"] = [{"step": 10, "accuracy": 0.4}]
    with pytest.raises(ValueError, match="step 0"):
        vs_trl_seeds.summarize(runs)
