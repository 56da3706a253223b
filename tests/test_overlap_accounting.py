"""bench/overlap.py's per-sample accounting, from synthetic run measures (no runs)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import overlap  # noqa: E402

from asyncrl.core.config import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def measures(config: str, *, samples: float, generated: int, wall: float, busy: float, compute: float, wait: float = 0.0) -> dict:
    return {"config": load_config(ROOT / "configs" / config).to_dict(), "samples": samples, "generated": generated,
            "wall_s": wall, "rollout_busy_s": busy, "learner_compute_s": compute, "learner_wait_s": wait, "weight_sync_s": 1.0,
            "dropped_stale": 0}


def test_an_engine_bound_run_is_not_credited_with_draining_its_buffer():
    # 192 trained in 180 s, but its engine generated only 170 in the window (busy 178 s): the rest came from the
    # buffer it filled during the warm-up step. Per trained sample that would be 0.94 s, below the engine's
    # 1.05 s of work per generated sample: an efficiency above 1.
    asyn = measures("smollm2_word_problems.yaml", samples=192, generated=170, wall=180.0, busy=178.0, compute=150.0)
    a = overlap.per_sample(asyn)
    assert a["run_s_trained"] == pytest.approx(180 / 192)
    assert a["run_s"] == pytest.approx(180 / 170)
    assert a["run_s"] >= a["gen_s"] and a["run_s"] >= a["train_s"] + a["sync_s"]
    sync = measures("smollm2_word_problems_sync.yaml", samples=192, generated=192, wall=240.0, busy=80.0, compute=150.0, wait=85.0)
    out = overlap.compare(asyn, sync)
    assert out["efficiency"] <= 1.0
    assert out["speedup"] == pytest.approx((240 / 192) / (180 / 170))


def test_a_learner_bound_run_is_timed_per_trained_sample():
    # the engine ran ahead (generated more than was trained): the learner's rate is the run's
    a = overlap.per_sample(measures("smollm2_word_problems.yaml", samples=192, generated=208, wall=200.0, busy=150.0, compute=190.0))
    assert a["run_s"] == pytest.approx(200 / 192) == a["run_s_trained"]
