"""bench/vs_trl.py's pure logic: the asyncrl clock from metrics rows, time to threshold, the ratios (no runs, no TRL)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def vs_trl():
    sys.path.insert(0, str(BENCH))  # vs_trl imports results_io as a sibling, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("vs_trl", BENCH / "vs_trl.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def rows(step_s: list[float], batch: int = 64, pause: float = 0.0, wait: float = 0.1, sync: float = 0.01) -> list[dict]:
    """Metrics rows of steps lasting `step_s` (wait, train, sync) with `pause` seconds between steps, from t=1000."""
    out, t = [], 1000.0
    for i, s in enumerate(step_s):
        out.append({"step": i, "time/step_s": s, "samples/trained_total": batch * (i + 1), "time/learner_wait_s": wait,
                    "time/train_start": t + wait, "time/train_end": t + s - sync, "time/weight_sync_s": sync})
        t += s + pause
    return out


def test_asyncrl_clock_is_wall_time_from_the_first_step(vs_trl):
    points = vs_trl.asyncrl_points(rows([2.0, 0.5, 0.25, 0.25, 0.5]), [0, 2, 4, 5])
    assert [p["step"] for p in points] == [0, 2, 4, 5]
    assert [p["train_s"] for p in points] == pytest.approx([0.0, 2.5, 3.0, 3.5])
    assert [p["samples"] for p in points] == [0, 128, 256, 320]


def test_asyncrl_clock_counts_the_pauses_between_steps(vs_trl):
    points = vs_trl.asyncrl_points(rows([1.0, 1.0, 1.0], pause=0.5), [1, 3])
    assert [p["train_s"] for p in points] == pytest.approx([1.0, 4.0])  # two pauses before the end of step 2


def test_asyncrl_clock_refuses_a_gap_in_the_metrics(vs_trl):
    with pytest.raises(ValueError, match="lacks steps"):
        vs_trl.asyncrl_points([r for r in rows([1.0, 1.0, 1.0]) if r["step"] != 1], [3])


def test_snapshot_steps_start_at_zero_and_end_at_the_last_step(vs_trl):
    assert vs_trl.snapshot_steps(40, 5) == [0, 5, 10, 15, 20, 25, 30, 35, 40]
    assert vs_trl.snapshot_steps(7, 3) == [0, 3, 6, 7]


def test_time_to_threshold_is_the_first_snapshot_at_or_above_it(vs_trl):
    timeline = [  # out of order on purpose; accuracy dips after first crossing
        {"step": 10, "train_s": 3.0, "samples": 640, "accuracy": 0.72},
        {"step": 0, "train_s": 0.0, "samples": 0, "accuracy": 0.50},
        {"step": 5, "train_s": 1.5, "samples": 320, "accuracy": 0.70},
        {"step": 15, "train_s": 4.5, "samples": 960, "accuracy": 0.65},
    ]
    assert vs_trl.time_to_threshold(timeline, 0.7)["step"] == 5
    assert vs_trl.time_to_threshold(timeline, 0.71)["train_s"] == 3.0
    assert vs_trl.time_to_threshold(timeline, 0.9) is None


def test_ratios_say_how_many_times_faster_asyncrl_is(vs_trl):
    asyncrl = [{"step": 0, "train_s": 0.0, "samples": 0, "accuracy": 0.5},
               {"step": 10, "train_s": 2.0, "samples": 640, "accuracy": 0.8}]
    trl = [{"step": 0, "train_s": 0.0, "samples": 0, "accuracy": 0.5},
           {"step": 5, "train_s": 3.0, "samples": 320, "accuracy": 0.75},
           {"step": 10, "train_s": 8.0, "samples": 640, "accuracy": 0.8}]
    r = vs_trl.ratios(asyncrl, trl, 0.75)
    assert r["time_to_threshold"] == pytest.approx(3.0 / 2.0)  # TRL seconds / asyncrl seconds
    assert r["samples_per_s"] == pytest.approx((640 / 2.0) / (640 / 8.0))
    assert vs_trl.ratios(asyncrl, trl, 0.9)["time_to_threshold"] is None
