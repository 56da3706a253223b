"""bench/recipe_runs.py: a recipe's runs reported run by run, from synthetic run summaries (no runs)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import recipe_runs  # noqa: E402


def summary(before: float, after: float) -> dict:
    return {"steps": 3, "stopped_by": "steps", "wall_s": 600.0, "eval/accuracy_before": before, "eval/accuracy_after": after,
            "eval/problems": 100, "eval/gained": 100 if after == 1.0 else 20, "eval/lost": 0,
            "samples": {"consumed": 48, "dropped_stale": 1, "dropped_error": 2, "lost": 0, "filtered": 5}}


METRICS = [{"step": 0, "reward/mean": 0.0, "learner/entropy": 0.6, "kl/ref": 0.0},
           {"step": 1, "reward/mean": 0.5, "learner/entropy": 0.04, "kl/ref": math.nan},
           {"step": 2, "reward/mean": 1.0, "learner/entropy": 0.1}, {"summary": "not a step"}]


def test_runs_are_reported_one_by_one_with_how_many_learned():
    runs = [recipe_runs.run_record(summary(0.0, 1.0), METRICS, 0, "python -m asyncrl.run --config c.yaml run.seed=0"),
            recipe_runs.run_record(summary(0.1, 0.3), METRICS, 1, "python -m asyncrl.run --config c.yaml run.seed=1")]
    assert runs[0]["per_step"][1] == {"step": 1, "reward/mean": 0.5, "learner/entropy": 0.04}  # the NaN KL left out
    assert len(runs[0]["per_step"]) == 3  # the line without a step is not a step
    text = recipe_runs.render({"config": "c.yaml", "gain": 0.3, "runs": runs})
    assert "**1 of 2**" in text
    assert "| 0 | 3 | 600 | 0.00 → 1.00 | 100 / 0 | 3 | 0.040 (1) | 0.50 |" in text
    assert "0.10 → 0.30 (did not learn)" in text  # +0.20 < 0.30
    assert "- seed 1: `python -m asyncrl.run --config c.yaml run.seed=1`" in text


def test_a_run_without_its_held_out_evaluation_is_refused():
    with pytest.raises(ValueError, match="seed 4: the run has no held-out accuracy.*run.eval=true"):
        recipe_runs.run_record(summary(math.nan, math.nan), METRICS, 4, "cmd")
