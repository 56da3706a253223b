"""Per-step metrics from the actors' counters (asyncrl.orchestration.step_metrics), by hand."""
from __future__ import annotations

import pytest

from asyncrl.analysis.runs import bottleneck
from asyncrl.core.messages import RewardStats, WorkerStats
from asyncrl.orchestration.step_metrics import engine_running, reward_metrics, rollout_metrics, sample_totals, timing_metrics

BUFFER = {"lost": 0, "buffered_groups": 2, "refused_admissions": 1, "dropped_stale": 4, "dropped_error": 0, "filtered": 4, "consumed": 12,
          "expiring_wait_s": 3.5, "expiring_wait_batches": 1}


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


def test_reward_pool_metrics_from_two_actors_counters():
    before = {0: RewardStats(worker_id=0, busy_s=1.0, wall_s=10.0, groups=4, group_wait_s=2.0),
              1: RewardStats(worker_id=1, busy_s=5.0, wall_s=10.0, groups=2, group_wait_s=9.0)}
    now = [RewardStats(worker_id=0, busy_s=3.0, wall_s=14.0, groups=6, group_wait_s=3.0, batches=4, batched_samples=10, cache_hits=3,
                       cache_misses=9, timeouts=1, calls=4, queue_depth=5, latencies=(0.1, 0.2, 0.3)),
           # actor 1 was restarted by Ray: its counters start again, so they are taken as they are
           RewardStats(worker_id=1, busy_s=1.0, wall_s=2.0, groups=1, group_wait_s=0.5, batches=1, batched_samples=2, crashes=2,
                       queue_depth=1, latencies=(0.4,))]
    m = reward_metrics(now, before)
    assert m["reward/busy_frac"] == pytest.approx((2.0 + 1.0) / (4.0 + 2.0))
    assert m["reward/group_wait_s"] == pytest.approx((1.0 + 0.5) / (2 + 1))
    assert m["reward/batch_size_mean"] == pytest.approx(12 / 5) and m["reward/cache_hit_rate"] == pytest.approx(3 / 12)
    assert (m["reward/timeouts_total"], m["reward/crashes_total"], m["reward/queue_depth"], m["reward/calls_total"]) == (1, 2, 6, 4)
    assert (m["reward/latency_p50_s"], m["reward/latency_p99_s"]) == (0.2, 0.4)
    assert "reward/latency_p50_s" not in reward_metrics([RewardStats(worker_id=0)], {})  # no samples answered: no latency


def test_the_verdict_is_reward_bound_when_groups_wait_on_scoring_longer_than_the_learner_waits():
    step = {"time/step_s": 1.0, "time/weight_sync_s": 0.0, "rollout/idle_frac": 0.0}
    waiting_on_reward = [{**step, "time/learner_wait_s": 0.5, "reward/group_wait_s": 0.8}] * 3
    assert bottleneck(waiting_on_reward).kind == "reward-bound"
    assert bottleneck([{**step, "time/learner_wait_s": 0.5, "reward/group_wait_s": 0.3}] * 3).kind == "generation-bound"
    assert bottleneck([{**step, "time/learner_wait_s": 0.0, "reward/group_wait_s": 0.05}] * 3).kind == "balanced"  # under 10 % of a step
    assert "reward wait" not in bottleneck([{**step, "time/learner_wait_s": 0.5}] * 3).ratios  # no pool, no ratio
