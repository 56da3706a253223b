"""Length bias from staleness: are the groups dropped as stale the long ones, and does oldest-first remove it?

Long responses take longest to generate, so under a tight bound their groups are the ones that reach the buffer
past `buffer.max_staleness` and are dropped: training then sees shorter responses than the policy writes. For
each variant, run the real-model recipe (configs/smollm2_word_problems.yaml) with `buffer.max_staleness=1` for
the same training time and read its trajectory store: the mean response length of the samples dropped as stale
against the ones trained on, and the drop rate. Variants:

- fifo: engines first come, first served; batches in arrival order (rollout.oldest_first=false, buffer.oldest_first=false)
- oldest_first: engines schedule by the version of a request's oldest token; batches take the oldest groups first
- wait: oldest_first, and the last batch at a version waits for a group in flight that it is the last allowed to
  train on (`buffer.expiring_wait_s`, the default); the first two variants never wait, as before it existed

    .venv/bin/python bench/length_bias.py                 # 3 x (10 min of training + ~1.5 min start-up) on 2 cores
    .venv/bin/python bench/length_bias.py --minutes 5 --variants fifo

Writes bench/results/length_bias.{md,json} (`--name` changes the stem).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from results_io import provenance, publish  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = {
    "fifo": ["rollout.oldest_first=false", "buffer.oldest_first=false", "buffer.expiring_wait_s=0"],
    "oldest_first": ["rollout.oldest_first=true", "buffer.oldest_first=true", "buffer.expiring_wait_s=0"],
    "wait": ["rollout.oldest_first=true", "buffer.oldest_first=true", "buffer.expiring_wait_s=120"],
}


def lengths(rows: list[dict], status: str) -> tuple[int, float]:
    """(samples, mean response length in tokens) of the records with `status`."""
    chosen = [len(r["response_ids"]) for r in rows if r["status"] == status]
    return len(chosen), (sum(chosen) / len(chosen) if chosen else float("nan"))


def run_job(config: str, out: Path, overrides: list[str], timeout_s: float) -> tuple[list[dict], dict]:
    """One `asyncrl.run` of `config` with `overrides` in run directory `out`, no evaluation, no checkpoints, no
    wandb: its trajectory records and summary.json."""
    from asyncrl.core.store import read_trajectories

    overrides = [f"run.output_dir={out}", "run.eval=false", "run.checkpoint_every=0", "logging.wandb=false",
                 "logging.console=false", *overrides]
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", config, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({' '.join(overrides)}):\n{proc.stderr[-3000:]}")
    return read_trajectories(out / "trajectories").to_pylist(), json.loads((out / "summary.json").read_text())


def run_one(out: Path, variant: str, args: argparse.Namespace) -> dict:
    overrides = [f"buffer.max_staleness={args.staleness}", f"run.max_train_minutes={args.minutes}", f"run.seed={args.seed}",
                 *VARIANTS[variant]]
    rows, summary = run_job(args.config, out, overrides, args.minutes * 60 + 1200)
    trained_n, trained_len = lengths(rows, "consumed")
    dropped_n, dropped_len = lengths(rows, "dropped_stale")
    return {
        "variant": variant, "steps": summary["steps"], "trained": trained_n, "dropped_stale": dropped_n,
        "drop_rate": dropped_n / max(trained_n + dropped_n, 1), "trained_len_mean": trained_len, "dropped_len_mean": dropped_len,
        "dropped_over_trained_len": dropped_len / trained_len if dropped_n else float("nan"),
        "generated_len_mean": (trained_n * trained_len + dropped_n * (dropped_len if dropped_n else 0.0)) / max(trained_n + dropped_n, 1),
        "wall_s": summary["wall_s"],
    }


def table(results: list[dict]) -> str:
    head = ("| variant | steps | trained | dropped stale | drop rate | mean length trained | mean length dropped | dropped / trained "
            "| mean length, trained + dropped | wall s |")
    lines = [head, "|" + "---|" * 10]
    for r in results:
        lines.append(f"| {r['variant']} | {r['steps']} | {r['trained']} | {r['dropped_stale']} | {r['drop_rate']:.3f} "
                     f"| {r['trained_len_mean']:.1f} | {r['dropped_len_mean']:.1f} | {r['dropped_over_trained_len']:.2f} "
                     f"| {r['generated_len_mean']:.1f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def render(result: dict) -> str:
    """The table, from the published result alone."""
    a = result["args"]
    return (f"Length bias from staleness: {a['config']}, buffer.max_staleness={a['staleness']}, {float(a['minutes']):g} min of training "
            f"per variant, seed {a['seed']}\n(`{' '.join(['bench/length_bias.py', *result['argv']])}`)\n\n{table(result['results'])}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smollm2_word_problems.yaml")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--staleness", type=int, default=1, help="buffer.max_staleness")
    parser.add_argument("--minutes", type=float, default=10.0, help="run.max_train_minutes per variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="length_bias", help="result file stem")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    results = []
    with tempfile.TemporaryDirectory(prefix="length-bias-") as tmp:
        for variant in args.variants:
            results.append(run_one(Path(tmp) / variant, variant, args))
            print(f"{variant}: {json.dumps(results[-1])}", flush=True)
    data = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results, "argv": sys.argv[1:]}
    publish(args.out, args.name, "length_bias", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
