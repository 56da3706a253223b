"""Per-step metrics from what the actors report: pure functions (docs/metrics.md names every key)."""
from __future__ import annotations

from asyncrl.core.messages import RewardStats, WorkerStats
from asyncrl.core.scoring import percentile

SEEN_KEYS = ("tokens", "busy_s", "idle_s")


def rollout_metrics(stats: list[WorkerStats], buffer: dict, seen: dict[int, dict], elapsed_s: float, restarts: int,
                    group_size: int, gone: list[WorkerStats] | tuple = ()) -> tuple[dict, dict[int, dict]]:
    """The rollout and buffer metrics of one step from every worker's counters and the buffer's, with the rates
    since the previous step (`seen`: each worker's counters then); returns them and the counters to keep. `gone`:
    the last counters of workers removed from the pool, which the run's totals keep."""
    elapsed_s = max(elapsed_s, 1e-9)
    per_worker, now_seen = {}, {}
    for st in stats:
        before = seen.get(st.worker_id, dict.fromkeys(SEEN_KEYS, 0))
        busy, idle = st.busy_s - before["busy_s"], st.idle_s - before["idle_s"]
        per_worker[f"rollout/w{st.worker_id}/tokens_per_s"] = (st.tokens - before["tokens"]) / elapsed_s
        per_worker[f"rollout/w{st.worker_id}/idle_frac"] = idle / max(busy + idle, 1e-9)
        now_seen[st.worker_id] = {k: getattr(st, k) for k in SEEN_KEYS}
    busy = sum(s.busy_s for s in stats)
    idle = sum(s.idle_s for s in stats)
    live, stats = stats, [*stats, *gone]  # rates from the live workers, totals over the run
    metrics = {
        "rollout/tokens_per_s": sum(v for k, v in per_worker.items() if k.endswith("tokens_per_s")),
        "rollout/idle_frac": idle / max(busy + idle, 1e-9), **per_worker,
        "rollout/busy_s_total": sum(s.busy_s for s in stats), "rollout/restarts_total": restarts, "buffer/lost_samples": buffer["lost"],
        "rollout/resubmitted_total": sum(s.resubmitted for s in stats),
        "rollout/resumed_tokens_total": sum(s.resumed_tokens for s in stats),
        "rollout/drain_s_total": sum(s.drain_s for s in stats),
        "rollout/turns_total": sum(s.turns for s in stats),
        "rollout/tool_calls_total": sum(s.tool_calls for s in stats),
        "rollout/tool_errors_total": sum(s.tool_errors for s in stats),
        "rollout/tool_s_mean": sum(s.tool_s for s in stats) / max(sum(s.tool_calls for s in stats), 1),
        "samples/generated_total": sum(s.groups_done for s in stats) * group_size,
        "rollout/inflight_groups": sum(s.inflight_groups for s in live),
        "rollout/scoring_groups": sum(s.scoring_groups for s in live),
        "rollout/scoring_retries_total": sum(s.scoring_retries for s in stats),
        "rollout/reward_hangs_total": sum(s.reward_hangs for s in stats),
        "buffer/buffered_groups": buffer["buffered_groups"], "buffer/refused_admissions": buffer["refused_admissions"],
        "buffer/dropped_stale": buffer["dropped_stale"], "buffer/dropped_error": buffer["dropped_error"],
        "buffer/filtered": buffer["filtered"],
        "buffer/expiring_wait_s_total": buffer["expiring_wait_s"], "buffer/expiring_wait_batches": buffer["expiring_wait_batches"],
        "samples/filtered_frac": buffer["filtered"] / max(buffer["filtered"] + buffer["consumed"], 1),
    }
    return metrics, {**seen, **now_seen}


def reward_metrics(stats: list[RewardStats], seen: dict[int, RewardStats]) -> dict:
    """The reward pool's metrics of one step from every reward actor's counters (`seen`: each one's at the previous
    step; an actor Ray restarted counts from 0 again). Latencies are the samples answered since then."""
    def since(s: RewardStats, key: str) -> float:
        now, before = getattr(s, key), getattr(seen.get(s.worker_id, RewardStats()), key)
        return now - before if now >= before else now

    latencies = [x for s in stats for x in s.latencies]
    hits, misses = sum(s.cache_hits for s in stats), sum(s.cache_misses for s in stats)
    groups = sum(since(s, "groups") for s in stats)
    metrics = {
        "reward/queue_depth": float(sum(s.queue_depth for s in stats)),
        "reward/batch_size_mean": sum(s.batched_samples for s in stats) / max(sum(s.batches for s in stats), 1),
        "reward/cache_hit_rate": hits / max(hits + misses, 1),
        "reward/timeouts_total": float(sum(s.timeouts for s in stats)),
        "reward/crashes_total": float(sum(s.crashes for s in stats)),
        "reward/calls_total": float(sum(s.calls for s in stats)),
        "reward/busy_frac": sum(since(s, "busy_s") for s in stats) / max(sum(since(s, "wall_s") for s in stats), 1e-9),
        "reward/group_wait_s": sum(since(s, "group_wait_s") for s in stats) / groups if groups else 0.0,
    }
    if latencies:
        metrics.update({"reward/latency_p50_s": percentile(latencies, 0.5), "reward/latency_p99_s": percentile(latencies, 0.99)})
    return metrics


def timing_metrics(step_s: float, waited_s: float, compute_s: float, sync: dict) -> dict:
    """Where one step's time went: waiting for a batch, training, the weight sync's share on the loop."""
    return {
        "time/step_s": step_s, "time/learner_wait_s": waited_s, "time/learner_wait_frac": waited_s / step_s,
        "time/learner_compute_s": compute_s, "time/weight_sync_s": sync["seconds"], "time/weight_sync_frac": sync["seconds"] / step_s,
        "weights/sync_bytes": sync["bytes"], "time/weight_settle_s": sync["settle_s"], "time/weight_send_s": sync["send_s"],
        "time/weight_load_s": sync["load_s"], "time/eval_wait_s": sync.get("eval_wait_s", 0.0),
        **({"sync/verified": sync["verified"], "sync/mismatches": sync["mismatches"], "time/weight_verify_s": sync["verify_s"],
            "time/weight_verify_learner_s": sync["verify_learner_s"], "time/weight_verify_engine_s": sync["verify_engine_s"]}
           if "verified" in sync else {}),
    }


def sample_totals(trained_total: int, generated_total: int, rollout_busy_s: float, learner_compute_total_s: float) -> dict:
    return {
        "samples/trained_total": trained_total,
        "samples/effective_rate": trained_total / max(generated_total, 1),
        "samples/cost_per_1k_effective": 1000 * (rollout_busy_s + learner_compute_total_s) / trained_total,
    }


def engine_running(traces: list[list[tuple[float, int]]]) -> dict:
    """Running requests per engine step, over every worker's engine steps since the last learner step."""
    running = [n for trace in traces for _, n in trace]
    if not running:
        return {}
    return {"rollout/running_mean": sum(running) / len(running), "rollout/running_min": float(min(running)),
            "rollout/engine_steps": float(len(running))}


def batch_histograms(batch: list[dict], version: int) -> dict[str, list[float]]:
    """Per-sample values of one batch, for wandb histograms."""
    return {
        "reward/hist": [float(s["reward"]) for s in batch],
        "staleness/hist": [float(version - s["policy_version_start"]) for s in batch],
        "samples/response_len_hist": [float(len(s["response_ids"])) for s in batch],
    }
