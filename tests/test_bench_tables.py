"""bench/results: every table with a JSON record is what its record renders (no benchmark runs, no Ray, no vLLM),
and results_io's provenance, plausibility check and rendering."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH))  # results_io as a benchmark imports it, and render_record imports the benchmarks from there
import results_io  # noqa: E402

RECORDS = sorted(p for p in RESULTS.glob("*.json") if "bench" in json.loads(p.read_text()))


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_committed_table_is_its_record_rendered(path: Path):
    """A table edited by hand, or left behind by a change of its benchmark's render(), fails here:
    `python bench/tables.py` rewrites it from the JSON."""
    md = path.with_suffix(".md")
    assert md.is_file(), f"{md.name} missing: run `python bench/tables.py`"
    assert results_io.render_record(json.loads(path.read_text())) == md.read_text(), (
        f"{md.name} differs from what {path.name} renders: run `python bench/tables.py` (or fix the benchmark's render())")


def test_records_exist():
    assert {p.stem for p in RECORDS} >= {"cpu_bf16", "learner_memory"}


META = {"date": "2026-12-06T10:00:00Z", "commit": "abc1234", "dirty": True, "command": "bench/scaling.py --steps 3",
        "cpu_model": "Test CPU", "cpu_flags": ["avx2"], "cores": 4, "usable_cores": 2, "loadavg": [0.5, 0.4, 0.3],
        "loadavg_start": [1.25, 1.0, 0.75], "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "vllm": None}}
SCALING = {"results": [
    {"rollout_workers": 1, "learner_workers": 1, "steps_timed": 2, "samples_per_s": 10.0, "tokens_per_s": 100.4, "learner_wait_frac": 0.25,
     "weight_sync_s": 0.0123},
    {"rollout_workers": 2, "learner_workers": 2, "steps_timed": 2, "samples_per_s": 15.0, "tokens_per_s": 150.6, "learner_wait_frac": 0.5,
     "weight_sync_s": 0.02},
], "cores": 2, "steps": 3, "argv": ["--steps", "3"]}


def test_render_record_of_a_synthetic_scaling_record():
    text = results_io.render_record({"bench": "scaling", "meta": META, "result": SCALING})
    assert text == (
        "Scaling on this machine (2 cores), default job, 3 steps each (step 0 not timed)\n"
        "(`bench/scaling.py --steps 3`)\n\n"
        "| R rollout | L learner | trained samples/s | vs R=1 L=1 | rollout tokens/s | learner wait | weight sync s/step |\n"
        "|---|---|---|---|---|---|---|\n"
        "| 1 | 1 | 10.0 | 1.00x | 100 | 25 % | 0.012 |\n"
        "| 2 | 2 | 15.0 | 1.50x | 151 | 50 % | 0.020 |\n\n"
        "Note: up to 4 worker processes on 2 cores: these rows measure contention, not scaling.\n\n"
        "_Measured 2026-12-06T10:00:00Z at commit abc1234 (uncommitted changes) on 4 cores (2 usable) (Test CPU; avx2), "
        "load average 1.25 → 0.50; torch 2.13.0+cpu, vllm not installed. Regenerate this table: `python bench/tables.py`; "
        "rerun the measurement: `bench/scaling.py --steps 3`._\n")


def test_publish_writes_a_record_that_renders_to_its_table(tmp_path, capsys):
    started = {**results_io.provenance(["--steps", "3"]), "loadavg": [9.0, 9.0, 9.0], "date": "2026-12-06T09:00:00Z"}
    results_io.publish(tmp_path, "scaling", "scaling", SCALING, ["--steps", "3"], started)
    record = json.loads((tmp_path / "scaling.json").read_text())
    assert record["bench"] == "scaling" and record["result"] == SCALING
    assert record["meta"]["loadavg_start"] == [9.0, 9.0, 9.0] and record["meta"]["date"] == "2026-12-06T09:00:00Z"
    assert (tmp_path / "scaling.md").read_text() == results_io.render_record(record)
    assert "Scaling on this machine" in capsys.readouterr().out


def test_tables_check_finds_a_table_edited_by_hand(tmp_path):
    (tmp_path / "scaling.json").write_text(json.dumps({"bench": "scaling", "meta": META, "result": SCALING}))
    (tmp_path / "scaling.md").write_text(results_io.render_record(json.loads((tmp_path / "scaling.json").read_text())))
    (tmp_path / "old.md").write_text("a table without its data\n")
    check = [sys.executable, str(BENCH / "tables.py"), "--check", "--results", str(tmp_path)]
    ok = subprocess.run(check, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "not regenerable" in ok.stdout and "old" in ok.stdout
    (tmp_path / "scaling.md").write_text((tmp_path / "scaling.md").read_text().replace("15.0", "16.0"))
    bad = subprocess.run(check, capture_output=True, text=True)
    assert bad.returncode == 1 and "scaling" in bad.stderr


def test_check_plausible():
    results_io.check_plausible("bench", 1.0, 1.0, "a fraction")  # at the bound: fine
    results_io.check_plausible("bench", 0.2, 1.0, "a fraction")
    with pytest.raises(SystemExit, match="impossible figure, a fraction = 1.5"):
        results_io.check_plausible("bench", 1.5, 1.0, "a fraction")


def test_provenance():
    meta = results_io.provenance([])
    assert set(meta) >= {"date", "commit", "dirty", "command", "cpu_model", "cpu_flags", "cores", "usable_cores", "loadavg", "versions"}
    assert meta["cores"] >= 1
    assert set(meta["versions"]) == {"python", "torch", "vllm", "transformers", "ray", "trl", "sglang", "datasets", "peft"}
    assert set(meta["cpu_flags"]) <= set(results_io.CPU_FLAGS)
    json.dumps(meta)  # goes into the record as it is


def test_a_records_name_is_the_benchs_for_the_default_job_and_carries_any_other_configs_stem_and_a_tag():
    from results_io import ROOT, record_name

    assert record_name("overlap", ROOT / "configs" / "default.yaml") == "overlap"
    assert record_name("overlap", Path("configs/smollm2_word_problems.yaml")) == "overlap_smollm2_word_problems"
    assert record_name("overlap", Path("configs/smollm2_word_problems.yaml"), "run2") == "overlap_smollm2_word_problems_run2"
    assert record_name("overlap", ROOT / "configs" / "default.yaml", "run2") == "overlap_run2"
    assert record_name("learner_phases", Path("/elsewhere/default.yaml")) == "learner_phases_default"  # not the default job
