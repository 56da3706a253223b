"""Per-step metrics from the actors' counters (asyncrl.orchestration.step_metrics), by hand."""
from __future__ import annotations

import pytest

from asyncrl.core.messages import WorkerStats
from asyncrl.orchestration.step_metrics import engine_running, rollout_metrics, sample_totals, timing_metrics

BUFFER = {"lost": 0, "buffered_groups": 2, "refused_admissions": 1, "dropped_stale": 4, "dropped_error": 0, "filtered": 4, "consumed": 12}


def worker(i, tokens, busy, idle, groups=3):
    return WorkerStats(worker_id=i, tokens=tokens, busy_s=busy, idle_s=idle, resubmitted=1, drain_s=0.5, groups_done=groups, inflight_groups=2)


def test_rates_are_since_the_previous_step_per_worker():
    first, seen = rollout_metrics([worker(0, 100, 8.0, 2.0), worker(1, 50, 5.0, 5.0)], BUFFER, {}, 10.0, 0, 4)
    assert first["rollout/w0/tokens_per_s"] == 10.0 and first["rollout/w1/tokens_per_s"] == 5.0
    assert first["rollout/tokens_per_s"] == 15.0 and first["rollout/idle_frac"] == pytest.approx(7 / 20)
    assert first["samples/generated_total"] == 24 and first["rollout/resubmitted_total"] == 2
    # 5 s later worker 0 made 60 more tokens, busy 4 s of it; worker 1 was replaced and starts from 0
    then, seen = rollout_metrics([worker(0, 160, 12.0, 3.0), worker(1, 20, 1.0, 0.0)],
                                 BUFFER, {0: seen[0]}, 5.0, 1, 4)
    assert then["rollout/w0/tokens_per_s"] == 12.0 and then["rollout/w0/idle_frac"] == pytest.approx(1 / 5)
    assert then["rollout/w1/tokens_per_s"] == 4.0 and then["rollout/restarts_total"] == 1
    assert seen == {0: {"tokens": 160, "busy_s": 12.0, "idle_s": 3.0}, 1: {"tokens": 20, "busy_s": 1.0, "idle_s": 0.0}}


def test_timing_totals_and_engine_running():
    sync = {"seconds": 0.5, "bytes": 10, "settle_s": 0.1, "send_s": 0.2, "load_s": 0.3}
    t = timing_metrics(10.0, 2.0, 7.0, sync)
    assert t["time/learner_wait_frac"] == 0.2 and t["time/weight_sync_frac"] == 0.05 and t["weights/sync_bytes"] == 10
    totals = sample_totals(32, 40, 6.0, 2.0)
    assert totals["samples/effective_rate"] == 0.8 and totals["samples/cost_per_1k_effective"] == 250.0
    assert engine_running([[(0.0, 4), (0.1, 2)], [(0.0, 6)]]) == {"rollout/running_mean": 4.0, "rollout/running_min": 2.0,
                                                                  "rollout/engine_steps": 3.0}
    assert engine_running([[], []]) == {}
