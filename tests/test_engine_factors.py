"""bench/engine_factors.py's table from a synthetic record: no engine, no model."""
from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # engine_factors imports results_io as a sibling, as when run as a script
import engine_factors  # noqa: E402


def _run(repeat: int, rate: float) -> dict:
    return {"repeat": repeat, "position": 0, "tokens": int(rate * 2), "wall_s": 2.0, "tokens_per_s": rate, "steps": 10,
            "running_mean": 64.0, "reloads": 3, "reload_s": 0.1}


def _data() -> dict:
    rates = {"alone": (100.0, 200.0), "group slots": (90.0, 160.0), "priority scheduling": (100.0, 200.0),
             "weight reloads": (80.0, 180.0), "weight reloads, KV kept": (95.0, 190.0), "learner load": (50.0, 150.0),
             "as asyncrl drives it": (40.0, 60.0), "the same, KV kept": (45.0, 70.0)}
    rows = [{"name": name, "factors": {**engine_factors.ALONE, **f}, "runs": [_run(k, r) for k, r in enumerate(rates[name])]}
            for name, f in engine_factors.ROWS]
    return {"config": "configs/default.yaml", "model": "tiny", "groups": 4, "group_size": 8, "max_inflight_groups": 16,
            "max_new_tokens": 8, "repeats": 2, "reload_every_s": 0.5, "reload_tensors": 12, "reload_bytes": 2_000_000,
            "rollout_cores": [0], "learner_cores": [1], "learner_load_shape": [64, 24], "rows": rows}


def test_render_every_row_and_its_ratio_to_alone():
    text = engine_factors.render(json.loads(json.dumps(_data())))  # as rendered from the published JSON
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert set(lines) >= {name for name, _ in engine_factors.ROWS}
    # ratio: per repeat against "alone" of the same repeat, median (min-max)
    assert lines["alone"].endswith("| **1.00 (1.00-1.00)** |")
    assert lines["group slots"].endswith("| **0.85 (0.80-0.90)** |")
    assert lines["learner load"].endswith("| **0.62 (0.50-0.75)** |")
    assert lines["as asyncrl drives it"].endswith("| **0.35 (0.30-0.40)** |")
    assert "| 150.0 (100.0-200.0) |" in lines["alone"]
    assert "| group | priority | yes | yes |" in lines["as asyncrl drives it"]
    assert "| request | fcfs | yes, KV kept | no |" in lines["weight reloads, KV kept"]


def test_render_marks_a_row_stopped_at_its_time_limit():
    data = _data()
    data["row_limit_s"] = 300.0
    reloads = next(row for row in data["rows"] if row["name"] == "weight reloads")
    reloads["runs"][1].update(finished=False, samples=128, samples_done=40)
    text = engine_factors.render(json.loads(json.dumps(data)))
    assert "| weight reloads (stopped at 300 s in 1 of 2 repeats, 40-40 of 128 samples done) | request |" in text
    assert "| weight reloads, KV kept | request |" in text  # finished rows carry no mark


def _phases_record(cpu: str, cores: int) -> dict:
    cases = [{"threads": t, "mini_batches": m, "correction": c, "per_sample_s": 0.1 * t + m + (c == "none")}
             for t, m, c in [(2, 1, None), (1, 4, None), (1, 1, None), (1, 4, "none")]]
    return {"bench": "learner_phases", "meta": {"cpu_model": cpu, "cores": cores, "date": "2026-12-07T16:07:46Z"},
            "result": {"cases": cases}}


def test_reload_every_auto_is_the_learner_step_measured_on_this_kind_of_machine(tmp_path):
    import pytest

    from asyncrl.core.config import load_config

    cfg = load_config(None, ["learner.batch_size=16"])
    here = {"cpu_model": "Xeon", "cores": 2}
    assert engine_factors.learner_step_s(_phases_record("Xeon", 2), 16, here) == pytest.approx(1.1 * 16)  # 1 thread, 1 update
    with pytest.raises(SystemExit, match="this kind of machine"):
        engine_factors.learner_step_s(_phases_record("EPYC", 2), 16, here)
    config = tmp_path / "recipe.yaml"
    with pytest.raises(SystemExit, match="run bench/learner_phases.py"):
        engine_factors.reload_every("auto", cfg, config, here, tmp_path)
    (tmp_path / "learner_phases_recipe.json").write_text(json.dumps(_phases_record("Xeon", 2)))
    seconds, source = engine_factors.reload_every("auto", cfg, config, here, tmp_path)
    assert seconds == pytest.approx(17.6) and "2026-12-07" in source
    assert engine_factors.reload_every("14", cfg, config, here, tmp_path) == (14.0, "given")
    data = {**_data(), "reload_every_s": seconds, "reload_every_from": source}
    assert "17.6 s (the recipe's learner step here, from learner_phases of 2026-12-07" in engine_factors.render(data)
    assert "every 0.5 s;" in engine_factors.render(_data())  # a given cadence: as before
