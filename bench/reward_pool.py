"""Generation against a slow reward: rollout tokens/s with scoring in the rollout loop and with the reward pool.

The rollout side of the default job, for real: one RolloutWorker (vLLM, pinned to core 0), the ReplayBuffer and,
where asked, RewardWorker actors (pinned to core 1, where the learner would be), on a local Ray cluster. The learner is replaced by a consumer that takes each
batch as soon as it is full, so that generation, not training, sets the pace and what the reward stage costs
generation shows undiluted (no weights move; the staleness bound is lifted). The slow reward is
`tests.reward_fns.sleepy_batched`: exact match after 100 ms per call, a batched reward (one call scores a batch;
in the rollout loop it is called once per sample).

    .venv/bin/python bench/reward_pool.py                 # ~4 min on 2 cores
    .venv/bin/python bench/reward_pool.py --seconds 60 --batch-size 64

Writes bench/results/reward_pool.{md,json}. Target: the pool with the slow reward keeps >= 0.9 of the tokens/s
of the instant reward; scoring it in the loop falls far below.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_io import provenance, publish  # noqa: E402  (bench/ is on sys.path when a benchmark runs as a script)

SLOW = "tests.reward_fns.sleepy_batched"
VARIANTS = [  # (name, reward, reward workers)
    ("instant reward, in the loop", "exact_match", 0),
    ("instant reward, pool of 2", "exact_match", 2),
    ("100 ms reward, pool of 2", SLOW, 2),
    ("100 ms reward, in the loop", SLOW, 0),
]


def measure(reward: str, workers: int, model_dir: str, seconds: float, tmp: Path, batch_size: int, capacity: int) -> dict:
    import ray

    from asyncrl.actors.buffer import ReplayBuffer
    from asyncrl.actors.rollout import RolloutWorker
    from asyncrl.core.config import load_config
    from asyncrl.orchestration.pools import RewardPool
    from asyncrl.orchestration.step_metrics import reward_metrics

    cfg = load_config(ROOT / "configs/default.yaml", [
        f"task.reward={reward}", f"reward.num_workers={workers}", "reward.num_cpus=0.25", "reward.cpu_affinity=[1]", f"reward.batch_size={batch_size}",
        "buffer.max_staleness=1000000", f"buffer.capacity_groups={capacity}", "logging.wandb=false",
    ])
    buffer = ray.remote(ReplayBuffer).options(num_cpus=0).remote(cfg, str(tmp / f"traj-{reward}-{workers}"))
    pool = RewardPool(cfg, None, buffer) if workers else None
    scorers = pool.actors if pool else []
    worker = ray.remote(RolloutWorker).options(num_cpus=1, max_concurrency=4).remote(0, cfg, model_dir, buffer, "bench", 0, 0, scorers)
    ray.get(worker.node_id.remote())
    ray.get(worker.start.remote())
    groups = cfg.groups_per_step

    def drain(until: float) -> int:
        taken = 0
        while time.monotonic() < until:
            batch = ray.get(buffer.get_batch.remote(groups, 0, 0, max(0.0, until - time.monotonic())))
            taken += len(batch) if batch else 0
        return taken

    drain(time.monotonic() + 10)  # warm-up: the engine's first steps, the scoring children's imports
    t0, s0 = time.monotonic(), ray.get(worker.stats.remote())
    seen = {s.worker_id: s for s in pool.stats()} if pool else {}
    trained = drain(t0 + seconds)
    t1, s1 = time.monotonic(), ray.get(worker.stats.remote())
    pool_metrics = reward_metrics(pool.stats(), seen) if pool else {}
    ray.get(worker.stop.remote())
    if pool:
        pool.close()
    for actor in [worker, buffer, *scorers]:
        ray.kill(actor)
    return {"tokens_per_s": (s1.tokens - s0.tokens) / (t1 - t0), "samples_per_s": trained / (t1 - t0),
            "loop_busy_frac": (s1.busy_s - s0.busy_s) / (t1 - t0), **pool_metrics}


def table(rows: list[dict]) -> str:
    base = rows[0]["tokens_per_s"]
    lines = ["| variant | rollout tokens/s | vs instant, in the loop | samples trained/s | engine busy | reward batch | reward busy | reward p50 / p99 |",
             "|" + "---|" * 8]
    for r in rows:
        pool = (f"{r['reward/batch_size_mean']:.1f} | {r['reward/busy_frac']:.0%} | "
                f"{r.get('reward/latency_p50_s', float('nan')) * 1e3:.0f} / {r.get('reward/latency_p99_s', float('nan')) * 1e3:.0f} ms"
                if "reward/busy_frac" in r else "– | – | –")
        lines.append(f"| {r['variant']} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base:.2f}x | {r['samples_per_s']:.0f} "
                     f"| {r['loop_busy_frac']:.0%} | {pool} |")
    return "\n".join(lines)


def render(result: dict) -> str:
    """The table, from the published result alone."""
    a, rows = result["args"], result["rows"]
    slow_pool, slow_loop = rows[2]["tokens_per_s"] / rows[0]["tokens_per_s"], rows[3]["tokens_per_s"] / rows[0]["tokens_per_s"]
    return (f"Reward pool: the default job's rollout side, {float(a['seconds']):.0f} s per variant, reward.batch_size {a['batch_size']}, "
            f"buffer.capacity_groups {a['capacity']}, "
            f"batches taken as soon as they are full\n"
            f"(`bench/reward_pool.py {' '.join(result['argv'])}`)\n\n{table(rows)}\n\n"
            f"100 ms reward: pool {slow_pool:.2f}x of the instant reward's tokens/s (target >= 0.9), in the loop {slow_loop:.2f}x\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="measured seconds per variant (after 10 s of warm-up)")
    parser.add_argument("--batch-size", type=int, default=128, help="reward.batch_size: at 100 ms a call, 2 actors score up to "
                        "2 x this / 0.1 s samples a second, which must exceed what the engine generates")
    parser.add_argument("--capacity", type=int, default=64, help="buffer.capacity_groups (the default job's): groups being "
                        "scored count against it, so it must cover what generation produces during a reward's latency")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="reward_pool")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    import ray

    from asyncrl.core.models import resolve_model_path
    from asyncrl.core.models.cache import cache_dir
    from asyncrl.orchestration.cluster import ACTOR_ENV

    os.chdir(ROOT)  # the actors import tests.reward_fns from the repository root
    model_dir = str(resolve_model_path("tiny", digits=2, seed=0, cache_dir=cache_dir()))
    env = {**ACTOR_ENV, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    ray.init(num_cpus=3, runtime_env={"env_vars": env}, include_dashboard=False, logging_level="WARNING")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, reward, workers in VARIANTS:
            rows.append({"variant": name, **measure(reward, workers, model_dir, args.seconds, Path(tmp), args.batch_size, args.capacity)})
            print(f"{name}: {rows[-1]['tokens_per_s']:,.0f} tokens/s", flush=True)
    ray.shutdown()
    data = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "argv": sys.argv[1:]}
    publish(args.out, args.name, "reward_pool", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
