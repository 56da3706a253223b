"""Trained samples per second with R rollout workers and L learner workers, measured in one run each.

    .venv/bin/python bench/scaling.py                      # R, L in {1, 2}: ~4 min on 2 cores
    .venv/bin/python bench/scaling.py --rollout 1 2 4 --learner 1 --steps 20

Every configuration trains the tiny model on the default job for the same
number of steps, without evaluation. Reported: trained samples/s over the
training loop, the ratio to R=1/L=1 of this run, generated tokens/s, the
fraction of step time the learner waited for data (above ~40 %: generation-
bound) and weight-sync seconds per step. Writes bench/results/scaling.{md,json}.

On a machine with fewer cores than R + L processes the workers share cores:
the table then measures contention, not scaling (this is said in the output).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from results_io import check_plausible, provenance, publish  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]


def run_one(out: Path, rollout: int, learner: int, steps: int) -> dict:
    overrides = [
        f"run.output_dir={out}", f"run.steps={steps}", "run.eval=false", "logging.wandb=false", "logging.console=false",
        f"rollout.num_workers={rollout}", f"learner.num_workers={learner}",
    ]
    proc = subprocess.run([sys.executable, "-m", "asyncrl.run", "--config", "configs/default.yaml", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({' '.join(overrides)}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = rows[1:]  # step 0 waits for the first batch of a cold pipeline
    seconds = sum(r["time/step_s"] for r in timed)
    return {
        "rollout_workers": rollout, "learner_workers": learner, "steps_timed": len(timed),
        "samples_per_s": sum(r["samples/trained"] for r in timed) / seconds,
        "tokens_per_s": sum(r["rollout/tokens_per_s"] for r in timed) / len(timed),
        "learner_wait_frac": sum(r["time/learner_wait_s"] for r in timed) / seconds,
        "weight_sync_s": sum(r["time/weight_sync_s"] for r in timed) / len(timed),
    }


def render(result: dict) -> str:
    """The table, from the published result alone."""
    results, cores = result["results"], result["cores"]
    base = results[0]["samples_per_s"]
    lines = [
        f"Scaling on this machine ({cores} cores), default job, {result['steps']} steps each (step 0 not timed)",
        f"(`{' '.join(['bench/scaling.py', *result['argv']])}`)", "",
        "| R rollout | L learner | trained samples/s | vs R=1 L=1 | rollout tokens/s | learner wait | weight sync s/step |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in results:
        lines.append(f"| {x['rollout_workers']} | {x['learner_workers']} | {x['samples_per_s']:.1f} | {x['samples_per_s'] / base:.2f}x "
                     f"| {x['tokens_per_s']:.0f} | {100 * x['learner_wait_frac']:.0f} % | {x['weight_sync_s']:.3f} |")
    busiest = max(x["rollout_workers"] + x["learner_workers"] for x in results)
    if busiest > (cores or 1):
        lines += ["", f"Note: up to {busiest} worker processes on {cores} cores: these rows measure contention, not scaling."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollout", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--learner", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    results = []
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        for r in args.rollout:
            for l in args.learner:
                results.append(run_one(Path(tmp) / f"r{r}-l{l}", r, l, args.steps))
                print(f"R={r} L={l}: {results[-1]['samples_per_s']:.1f} samples/s", flush=True)
    for x in results:
        check_plausible("scaling", x["learner_wait_frac"], 1.0, f"learner waiting fraction at R={x['rollout_workers']} L={x['learner_workers']}")
    data = {"results": results, "cores": os.cpu_count(), "steps": args.steps, "argv": sys.argv[1:]}
    publish(args.out, "scaling", "scaling", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
