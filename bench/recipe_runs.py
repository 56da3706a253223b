"""Does a recipe learn every time? Several runs of one config, one seed each, reported run by run.

    .venv/bin/python bench/recipe_runs.py --config configs/smollm2_agent.yaml --seeds 0 1 2
    .venv/bin/python bench/recipe_runs.py --config configs/smollm2_function_calling.yaml --resume   # goes on where it stopped

Each run is `python -m asyncrl.run --config CONFIG run.seed=S run.output_dir=KEEP/seedS *SETS` with the config's own
held-out evaluation (greedy, before and after training); a run learned when its held-out accuracy gained at least
`--gain` (absolute). The record (bench/results/recipe_runs_<config>.json) keeps each run's command, summary and
per-step reward, entropy, turns and KL, and when and at which commit it ran. With `--resume` the runs an earlier
invocation of the same job finished are taken (each finished run leaves `KEEP/seedS.json`, and the same record in
bench/results/recipe_runs_<config>.seeds/, to commit: runs too long for one sitting are done a few at a time) and
the others run.
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

from results_io import ROOT, provenance, publish, run_asyncrl

STEP_KEYS = ("reward/mean", "learner/entropy", "episodes/turns_mean", "kl/ref", "samples/response_len_mean", "staleness/mean")
SUMMARY_KEYS = ("steps", "stopped_by", "wall_s", "eval/accuracy_before", "eval/accuracy_after", "eval/problems", "eval/gained", "eval/lost")


# ----------------------------------------------------------------------------- pure logic (tested)
def run_record(summary: dict, metrics: list[dict], seed: int, command: str) -> dict:
    """One run's entry: its command, the summary's figures, its samples' statuses and the per-step metrics. A held-out
    accuracy that is missing or outside [0, 1] raises: the benchmark stops before it publishes."""
    before, after = summary.get("eval/accuracy_before"), summary.get("eval/accuracy_after")
    if not all(isinstance(v, (int, float)) and 0.0 <= v <= 1.0 for v in (before, after)):
        raise ValueError(f"seed {seed}: the run has no held-out accuracy before and after (got {before!r} -> {after!r}); "
                         "a recipe run needs run.eval=true")
    steps = [{"step": m["step"], **{k: m[k] for k in STEP_KEYS if isinstance(m.get(k), (int, float)) and not math.isnan(m[k])}}
             for m in metrics if "step" in m]
    return {"seed": seed, "command": command, **{k: summary.get(k) for k in SUMMARY_KEYS},
            "samples": summary.get("samples", {}), "per_step": steps}


def learned(run: dict, gain: float) -> bool:
    return run["eval/accuracy_after"] - run["eval/accuracy_before"] >= gain - 1e-9


def render(data: dict) -> str:
    runs, gain = data["runs"], data["gain"]
    n = sum(learned(r, gain) for r in runs)
    lines = [f"`{data['config']}`, {len(runs)} runs, one seed each; a run learned when its held-out accuracy (greedy, "
             f"{runs[0].get('eval/problems') or '?'} records) gained at least {gain:.2f}: **{n} of {len(runs)}**.", "",
             "| seed | steps | seconds (training and both evaluations) | held-out before → after | gained / lost | samples dropped | lowest entropy (step) | last 5 steps' reward |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        per = r["per_step"]
        ent = [(s["learner/entropy"], s["step"]) for s in per if "learner/entropy" in s]
        low = f"{min(ent)[0]:.3f} ({min(ent)[1]})" if ent else "–"
        tail = [s["reward/mean"] for s in per[-5:] if "reward/mean" in s]
        tail_text = f"{sum(tail) / len(tail):.2f}" if tail else "–"
        dropped = sum(v for k, v in r["samples"].items() if k.startswith("dropped") or k == "lost")
        mark = "" if learned(r, gain) else " (did not learn)"
        lines.append(f"| {r['seed']} | {r['steps']} | {r['wall_s']:.0f} | {r['eval/accuracy_before']:.2f} → {r['eval/accuracy_after']:.2f}{mark} | "
                     f"{r.get('eval/gained', '–')} / {r.get('eval/lost', '–')} | {dropped} | {low} | "
                     f"{tail_text} |")
    lines += ["", "Commands (each from the repository root):", ""] + [
        f"- seed {r['seed']}: `{r['command']}`" + (f" ({r['date'][:10]}, commit {r['commit']}{', uncommitted changes' if r.get('dirty') else ''})" if r.get("date") else "")
        for r in runs]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- measurement
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the recipe's config")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--gain", type=float, default=0.3, help="the held-out gain that counts as learned")
    parser.add_argument("--keep", type=Path, default=None, help="where the runs go (default bench/work/recipe_runs_<config>)")
    parser.add_argument("--resume", action="store_true",
                        help="take the runs this same job finished in --keep before; run the others (an unfinished one again, from its start)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--run-hours", type=float, default=6.0,
                        help="a run's time limit (the function-calling recipe took over 2 h beside other work)")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    name = "recipe_runs_" + Path(args.config).stem
    keep = args.keep or Path("bench") / "work" / name  # relative to the repository, where the runs go (run_asyncrl)
    runs = []
    for seed in args.seeds:
        overrides = [*args.set, f"run.seed={seed}", f"run.output_dir={keep / f'seed{seed}'}", "logging.wandb=false"]
        command = shlex.join(["python", "-m", "asyncrl.run", "--config", args.config, *overrides])
        run_dir, done = ROOT / keep / f"seed{seed}", ROOT / keep / f"seed{seed}.json"  # ROOT / keep is keep when absolute
        committed = args.out / f"{name}.seeds" / f"seed{seed}.json"  # the same record, to commit: a session's bench/work goes with it
        kept = next((json.loads(f.read_text()) for f in (done, committed) if args.resume and f.is_file()), None)
        if kept is not None and kept["command"] == command:
            print(f"recipe_runs: seed {seed}: finished by an earlier invocation ({kept.get('commit', '?')}, {kept.get('date', '?')})", flush=True)
            runs.append(kept)
            continue
        if run_dir.exists():
            if not args.resume:
                parser.error(f"{run_dir} exists: a run there would resume from its checkpoint (move it away, or --resume)")
            run_dir.rename(run_dir.with_name(f"{run_dir.name}.stopped-{int(time.time())}"))  # kept, out of the way
        print(f"recipe_runs: {command}", flush=True)
        began = provenance(sys.argv[1:])
        run_asyncrl(Path(args.config), overrides, timeout_s=args.run_hours * 3600)
        summary = json.loads((run_dir / "summary.json").read_text())
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        runs.append({**run_record(summary, metrics, seed, command), "date": began["date"], "commit": began["commit"],
                     "dirty": began["dirty"], "loadavg": began["loadavg"]})
        for f in (done, committed):
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(runs[-1], indent=1) + "\n")
    publish(args.out, name, "recipe_runs", {"config": args.config, "gain": args.gain, "runs": runs}, sys.argv[1:], start)


if __name__ == "__main__":
    main()
