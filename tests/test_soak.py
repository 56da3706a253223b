"""bench/soak.py's pure parts: which faults can be drawn, when the run has recovered from one, and the audit of the
trajectory store (the soak itself is a benchmark: `bench/soak.py`)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from soak import KINDS, audit, possible, recovered, render  # noqa: E402


def test_the_pool_is_never_asked_past_its_bounds():
    assert "worker_added" not in possible(KINDS, 3, 1, 3) and "worker_removed" in possible(KINDS, 3, 1, 3)
    assert "worker_removed" not in possible(KINDS, 1, 1, 3) and "worker_added" in possible(KINDS, 1, 1, 3)
    assert set(possible(KINDS, 2, 1, 3)) == set(KINDS)


def test_recovery_is_read_off_the_runs_own_counters():
    before = {"rollout/restarts_total": 1, "learner/restarts_total": 0, "rollout/workers": 2}
    assert recovered("engine_kill", before, {**before, "rollout/restarts_total": 2}, None)
    assert not recovered("engine_freeze", before, before, None)
    assert recovered("learner_kill", before, {**before, "learner/restarts_total": 1}, None)
    assert not recovered("worker_added", before, {**before, "rollout/workers": 2, "rollout/workers_starting": 1}, 3)
    assert recovered("worker_added", before, {**before, "rollout/workers": 3, "rollout/workers_starting": 0}, 3)
    assert not recovered("worker_removed", before, {**before, "rollout/workers": 2, "rollout/workers_retiring": 1}, 1)


def sample(i: int, status: str, start: int = 0, consumed: int | None = None) -> dict:
    return {"sample_id": f"s{i}", "status": status, "policy_version_start": start, "consumed_version": consumed}


def test_the_audit_finds_lost_duplicated_twice_trained_and_stale_samples():
    clean = [sample(0, "consumed", 3, 4), sample(1, "dropped_error"), sample(2, "unconsumed_at_end"), sample(3, "consumed", 4, 4)]
    a = audit(clean, admitted_groups=2, group_size=2, max_staleness=1)
    assert (a["lost_silently"], a["recorded_twice"], a["trained_twice"], a["staleness_violations"], a["trained"]) == (0, 0, 0, 0, 2)
    bad = [*clean[:3], sample(0, "consumed", 3, 4), sample(4, "consumed", 1, 4)]  # s0 twice, s4 three versions stale, s3 missing
    a = audit(bad, admitted_groups=3, group_size=2, max_staleness=1)
    assert (a["lost_silently"], a["recorded_twice"], a["trained_twice"], a["staleness_violations"]) == (2, 1, 1, 1)


def test_the_table_counts_each_kind_and_its_recovery_times():
    faults = [{"kind": "engine_kill", "recovered": True, "recover_s": 4.0}, {"kind": "engine_kill", "recovered": True, "recover_s": 8.0},
              {"kind": "learner_kill", "recovered": False, "recover_s": None},
              {"kind": "worker_added", "recovered": False, "recover_s": None, "cut_by_end": True}]
    a = audit([sample(0, "consumed", 0, 0)], 1, 1, 1)
    text = render({"config": "configs/smoke.yaml", "minutes": 2, "every_s": 20, "seed": 0, "steps": 50, "faults": faults, "audit": a})
    assert "**2 of 3 faults recovered from** (and 1 injected too late to see" in text and "| worker_added | 0 | 0 | – |" in text and "| engine_kill | 2 | 2 | 6.0 / 8.0 |" in text and "| learner_kill | 1 | 0 | – |" in text
