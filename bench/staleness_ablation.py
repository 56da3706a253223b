"""AReaL's staleness ablation at toy scale: accuracy after a fixed number of samples.

For each `buffer.max_staleness` in {0, 2, 8} and `algorithm.correction` in
{none, decoupled}, train the tiny model on the default job for the same number
of steps (so the same number of trained samples) and report held-out greedy
accuracy, with the staleness actually measured. `learner.delay_s` slows the
learner so that rollouts run ahead up to the bound and staleness is real
(without it generation is the bottleneck on these machines and staleness stays
near 1 whatever the bound).

    .venv/bin/python bench/staleness_ablation.py            # ~10 min on 2 cores
    .venv/bin/python bench/staleness_ablation.py --steps 10 --staleness 0 2 --corrections decoupled
    .venv/bin/python bench/staleness_ablation.py --config configs/smollm2_word_problems.yaml --steps 40 \
        --staleness 0 2 4 --corrections none decoupled decoupled:seq_mis --delay 0 --name staleness_ablation_smollm2

A correction is `algorithm.correction`, or `correction:preset` to set `algorithm.rollout_correction` too.

Writes bench/results/staleness_ablation.{md,json} (`--name` changes the stem).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from results_io import check_plausible, provenance, publish  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "configs/default.yaml"


def correction_overrides(spec: str) -> list[str]:
    """`decoupled` -> algorithm.correction; `decoupled:seq_mis` -> that and algorithm.rollout_correction."""
    correction, _, preset = spec.partition(":")
    return [f"algorithm.correction={correction}"] + ([f"algorithm.rollout_correction={preset}"] if preset else [])


def run_one(out: Path, staleness: int, correction: str, args: argparse.Namespace) -> dict:
    overrides = [
        f"run.output_dir={out}", f"run.steps={args.steps}", f"run.seed={args.seed}",
        f"buffer.max_staleness={staleness}", *correction_overrides(correction), f"learner.delay_s={args.delay}",
        "logging.wandb=false", "logging.console=false", "run.max_train_minutes=0", "run.checkpoint_every=0",
    ]
    if args.lr is not None:
        overrides.append(f"learner.lr={args.lr}")
    overrides += args.set
    if args.config == DEFAULT_CONFIG:  # room for a full (s + 1) batches ahead, so the admission rule and not the buffer bounds staleness
        overrides += [f"buffer.capacity_groups={(staleness + 2) * 8}", "rollout.max_inflight_groups=16"]
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", args.config, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({' '.join(overrides)}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = sum(r["samples/trained"] for r in rows)
    return {
        "max_staleness": staleness, "correction": correction, "samples_trained": int(trained),
        "staleness_mean": sum(r["staleness/mean"] * r["samples/trained"] for r in rows) / trained,
        "staleness_max": max(r["staleness/max"] for r in rows),
        "is_ratio_max": max(r.get("is_ratio/max", 1.0) for r in rows),
        "accuracy_before": summary["eval/accuracy_before"], "accuracy_after": summary["eval/accuracy_after"],
        "gain_paired_se": summary.get("eval/gain_paired_se"),
        "kept_frac": sum(r.get("loss/kept_frac", 1.0) for r in rows) / len(rows),
        "dropped_stale": summary["samples"].get("dropped_stale", 0), "wall_s": summary["wall_s"],
    }


def table(results: list[dict]) -> str:
    head = ("| max_staleness | correction | trained | staleness mean / max | IS ratio max | tokens kept | accuracy before → after "
            "| gain / paired SE | dropped stale | wall s |")
    lines = [head, "|" + "---|" * 10]
    for r in results:
        lines.append(
            f"| {r['max_staleness']} | {r['correction']} | {r['samples_trained']} | {r['staleness_mean']:.2f} / {r['staleness_max']:.0f} "
            f"| {r['is_ratio_max']:.2f} | {r['kept_frac']:.3f} | {r['accuracy_before']:.3f} → {r['accuracy_after']:.3f} | {_gain(r)} "
            f"| {r['dropped_stale']} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def _gain(r: dict) -> str:
    gain, se = r["accuracy_after"] - r["accuracy_before"], r.get("gain_paired_se")
    return f"{gain:+.3f} / {gain / se:.1f} SE" if se else f"{gain:+.3f}"


def render(result: dict) -> str:
    """The table, from the published result alone (`args` as published: strings)."""
    a = result["args"]
    lr = None if a["lr"] == "None" else float(a["lr"])
    return (
        f"Staleness ablation: {a['config']}, {a['steps']} steps, lr {lr or 'of the config'}, learner.delay_s {a['delay']}, seed {a['seed']}\n"
        f"(`{' '.join(['bench/staleness_ablation.py', *result['argv']])}`)\n\n{table(result['results'])}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 2, 8])
    parser.add_argument("--corrections", nargs="+", default=["none", "decoupled"])
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--steps", type=int, default=30, help="learner steps per run (x learner.batch_size samples)")
    parser.add_argument("--lr", type=float, default=None, help="learner.lr (default: the config's)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    parser.add_argument("--delay", type=float, default=1.0, help="learner.delay_s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides for every run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="staleness_ablation", help="result file stem")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    results = []
    with tempfile.TemporaryDirectory(prefix="ablation-") as tmp:
        for s in args.staleness:
            for correction in args.corrections:
                results.append(run_one(Path(tmp) / f"s{s}-{correction}", s, correction, args))
                print(f"max_staleness={s} correction={correction}: {results[-1]['accuracy_after']:.3f}", flush=True)
    for r in results:
        for key in ("accuracy_before", "accuracy_after", "kept_frac"):
            check_plausible("staleness_ablation", r[key], 1.0, f"{key} at max_staleness {r['max_staleness']}, {r['correction']}")
    data = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results, "argv": sys.argv[1:]}
    publish(args.out, args.name, "staleness_ablation", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
