"""bench/accuracy_protocol.py: the dev-phase choice of learning rates and threshold, and the runs it asks for (no runs)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import accuracy_protocol as ap  # noqa: E402


def side(*accuracies: float) -> dict:
    return {"points": [{"step": 8 * i, "accuracy": a} for i, a in enumerate(accuracies)]}


def dev_run(asyncrl: tuple, sync: tuple, trl: tuple) -> dict:
    return {"split": "dev", "asyncrl": side(*asyncrl), "sync": side(*sync), "trl_vllm": side(*trl)}


DEV = {
    "2.5e-4": dev_run((0.2, 0.30, 0.33), (0.2, 0.28, 0.30), (0.2, 0.25, 0.31)),
    "5e-4": dev_run((0.2, 0.40, 0.42), (0.2, 0.36, 0.35), (0.2, 0.30, 0.31)),
    "1e-3": dev_run((0.2, 0.45, 0.38), (0.2, 0.30, 0.34), (0.2, 0.29, 0.28)),
}


def test_each_side_keeps_the_rate_of_its_highest_final_dev_accuracy():
    choice = ap.choose(DEV)
    # asyncrl: finals 0.33 / 0.42 / 0.38 -> 5e-4 (1e-3 peaked higher mid-run, but the final decides)
    # sync: 0.30 / 0.35 / 0.34 -> 5e-4; TRL: 0.31 / 0.31 / 0.28 -> a tie goes to the smaller rate, 2.5e-4
    assert choice["lr"] == {"asyncrl": "5e-4", "sync": "5e-4", "trl_vllm": "2.5e-4"}
    # the highest accuracy each reached at its rate: 0.42, 0.36, 0.31 -> the lowest, every side reaches it
    assert choice["reached"] == {"asyncrl": 0.42, "sync": 0.36, "trl_vllm": 0.31}
    assert choice["threshold"] == 0.31


def test_the_threshold_rounds_down_so_that_every_side_reached_it():
    dev = {"5e-4": dev_run((0.2, 0.4), (0.2, 0.379), (0.2, 0.45))}
    assert ap.choose(dev)["threshold"] == 0.37


def test_a_threshold_the_untrained_model_already_meets_is_refused():
    # asyncrl never beat its step-0 accuracy at any rate: the threshold would be 0.30, met at step 0 by every side
    dev = {"2.5e-4": dev_run((0.3, 0.29, 0.30), (0.3, 0.33, 0.35), (0.3, 0.4, 0.4)),
           "5e-4": dev_run((0.3, 0.27, 0.28), (0.3, 0.36, 0.36), (0.3, 0.38, 0.41))}
    with pytest.raises(ValueError, match=r"untrained model's dev accuracy \(0.300\): \['asyncrl'\] never passed it.*asyncrl 0.300"):
        ap.choose(dev)


def test_runs_on_test_problems_or_without_a_side_are_refused():
    with pytest.raises(ValueError, match="'test' problems, not dev"):
        ap.choose({"5e-4": {**DEV["5e-4"], "split": "test"}})
    partial = {k: v for k, v in DEV["5e-4"].items() if k != "sync"}
    with pytest.raises(ValueError, match=r"lacks the sides \['sync'\]"):
        ap.choose({"5e-4": partial})


def test_test_runs_use_each_sides_rate_and_the_dev_threshold_on_the_dev_phases_stream():
    choice = ap.choose(DEV)
    args = ap.test_args("configs/a.yaml", "configs/a_sync.yaml", choice, 2, 64, 8, 200)
    pairs = list(zip(args, args[1:]))
    assert ("--split", "test") in pairs and ("--threshold", "0.31") in pairs and ("--tag", "test-s2") in pairs
    assert ("--set", "run.seed=2") in pairs and ("--set", "task.dev_size=200") in pairs
    assert ("--set", "learner.lr=5e-4") in pairs and ("--sync-set", "learner.lr=5e-4") in pairs
    assert ("--trl-set", "learner.lr=2.5e-4") in pairs
    dev = ap.dev_args("configs/a.yaml", "configs/a_sync.yaml", "1e-3", 64, 8, 200)
    assert ("--split", "dev") in zip(dev, dev[1:]) and ("--set", "learner.lr=1e-3") in zip(dev, dev[1:])
    assert "--vllm-only" in dev and ("--trl-config", "configs/a_sync.yaml") in zip(dev, dev[1:])
    # one compute dtype on every machine a side may run on (auto would be bf16 on some CPUs, float32 on others)
    assert ("--set", "model.dtype=float32") in pairs and ("--set", "model.dtype=float32") in zip(dev, dev[1:])


def test_the_choice_table_marks_the_kept_rates():
    data = {**ap.choose(DEV), "config": "configs/smollm2_word_problems.yaml", "steps": 64, "dev_size": 200}
    text = ap.render(data)
    assert "| 5e-4 | **0.420** | **0.350** | 0.310 |" in text
    assert "| 2.5e-4 | 0.330 | 0.300 | **0.310** |" in text
    assert "Threshold for the test runs (the lowest of these, rounded down): **0.31**." in text


def test_the_dev_phase_never_reads_the_test_problems():
    dev = ap.dev_args("configs/a.yaml", "configs/a_sync.yaml", "5e-4", 64, 8, 200)
    assert ("--set", "run.eval=false") in zip(dev, dev[1:])  # asyncrl's own evaluation scores the test problems
    assert ("--split", "dev") in zip(dev, dev[1:])


def test_each_side_runs_alone_and_the_record_waits_for_all_three_in_the_ledger(tmp_path, monkeypatch):
    monkeypatch.setattr(ap, "LEDGER", tmp_path)
    args = ap.dev_args("configs/smollm2_word_problems.yaml", "configs/smollm2_word_problems_sync.yaml", "5e-4", 64, 8, 200)
    cmds, rec = ap.vs_trl_commands(args, ("asyncrl", "sync"))
    assert [c[c.index("--only") + 1] for c in cmds] == ["asyncrl", "sync"]  # TRL's side not yet: no record either
    assert all(c[c.index("--ledger") + 1] == str(tmp_path / "smollm2_word_problems_dev-lr5e-4") for c in cmds)
    assert rec.name == "vs_trl_smollm2_word_problems_dev-lr5e-4.json"
    monkeypatch.setattr(ap, "LEDGER", ap.ROOT / "bench" / "results" / "sides")  # the records show paths from the root
    cmds, _ = ap.vs_trl_commands(args, ("asyncrl",))
    pairs = list(zip(cmds[0], cmds[0][1:]))
    assert ("--ledger", "bench/results/sides/smollm2_word_problems_dev-lr5e-4") in pairs
    assert ("--keep", "bench/work/smollm2_word_problems_dev-lr5e-4") in pairs
    monkeypatch.setattr(ap, "LEDGER", tmp_path)

    ledger = tmp_path / "smollm2_word_problems_dev-lr5e-4"
    ledger.mkdir()
    for s in ("asyncrl", "sync"):
        (ledger / f"{s}.json").write_text('{"job": "j", "run": {}, "scored": {"dev": []}}')
    (ledger / "trl_vllm.json").write_text('{"job": "j", "run": {}}')  # run but not scored: not done
    assert ap.ledgered(ledger) == {"asyncrl", "sync"}
    cmds, _ = ap.vs_trl_commands(args, ("trl_vllm",))
    assert "--only" in cmds[0] and len(cmds) == 2 and "--only" not in cmds[1]  # TRL's side, then the record of all three


def test_a_test_runs_sides_share_one_kind_of_machine(tmp_path):
    xeon = {"nproc": 2, "cpu_model": "Xeon", "load_avg_1m_at_start": 0.2}
    epyc = {"nproc": 2, "cpu_model": "EPYC", "load_avg_1m_at_start": 0.1}
    (tmp_path / "asyncrl.json").write_text(json.dumps({"job": "j", "machine": xeon}))
    (tmp_path / "sync.json").write_text(json.dumps({"job": "j"}))  # recorded before sides kept their machine
    assert ap.elsewhere(tmp_path, {**xeon, "load_avg_1m_at_start": 1.9}) == {}  # the load differs, the kind does not
    assert ap.elsewhere(tmp_path, epyc) == {"asyncrl": "2 cores (Xeon)"}
    assert ap.elsewhere(tmp_path, {**xeon, "nproc": 4}) == {"asyncrl": "2 cores (Xeon)"}
    assert ap.elsewhere(tmp_path / "none yet", epyc) == {}


def test_the_summary_names_the_seeds_not_recorded_yet(tmp_path, monkeypatch):
    monkeypatch.setattr(ap, "BENCH", tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "vs_trl_smollm2_word_problems_test-s1.json").write_text("{}")
    monkeypatch.setattr(sys, "argv", ["accuracy_protocol.py", "summary"])
    with pytest.raises(SystemExit, match=r"test seed\(s\) 0, 2 not recorded"):
        ap.main()
