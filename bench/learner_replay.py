"""The learner inside a run against the same batches alone: what sharing the machine with the run costs it.

    .venv/bin/python bench/learner_replay.py                                    # the tiny default job and its baseline
    .venv/bin/python bench/learner_replay.py --config configs/smollm2_word_problems.yaml   # about 30 min on 2 cores

For each config (by default the job and its synchronous baseline, `<name>_sync.yaml`), one run of `--samples`
trained samples after a warm-up step (as bench/overlap.py runs it); then, in a fresh process with nothing else
running, a learner built from the run's own config (its threads, its pinning) trains on the run's batches, read
back from its trajectories, step by step in the run's order. Each step's learner compute in the run (the learner's
own clock, `time/learner_compute_s`) is set against the same step alone; the median ratio over the steps after
the first (warm-up) is what the rest of the run (engine, buffer, controller, Ray) costs the learner. The two
learners start from the same weights and take the same batches, so they do the same work. Writes
bench/results/learner_replay[_<config name>].{json,md}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import provenance, publish, record_name, run_samples, shown, sync_baseline  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]


def replay(run_dir: str) -> list[dict]:
    """Train a learner built from `run_dir`'s config on its batches, in order; per step: samples, seconds alone, in the run."""
    sys.path.insert(0, str(ROOT))
    import torch

    from asyncrl.actors.learner import Learner
    from asyncrl.analysis.runs import load_run
    from asyncrl.core.config import load_config
    from asyncrl.core.models import model_dir
    from asyncrl.core.schema import Status

    run = load_run(run_dir)
    cfg = load_config(Path(run_dir) / "config.yaml")
    learner = Learner(cfg, str(model_dir(cfg)), 0)  # pins itself and sets its threads as the run's learner did
    consumed = [r for r in run.trajectories.to_pylist() if r["status"] == Status.CONSUMED.value]
    by_step: dict[int, list[dict]] = {}
    for r in consumed:
        by_step.setdefault(r["consumed_step"], []).append(r)
    in_run = {m["step"]: m["time/learner_compute_s"] for m in run.metrics if "time/learner_compute_s" in m}
    out = []
    for step in sorted(by_step):
        batch = by_step[step]
        t0 = time.perf_counter()
        learner.train_step(batch, max(r["consumed_version"] for r in batch))
        out.append({"step": step, "samples": len(batch), "alone_s": time.perf_counter() - t0, "in_run_s": in_run[step],
                    "threads": torch.get_num_threads()})
    return out


def side(config: Path, samples: int, seed: int) -> dict:
    """One run of `config` and the replay of its batches."""
    from asyncrl.core.config import load_config

    cfg = load_config(config)
    with tempfile.TemporaryDirectory(prefix="learner_replay_") as tmp:
        out = Path(tmp) / "run"
        steps = run_samples(config, out, samples, seed)
        proc = subprocess.run([sys.executable, __file__, "--worker", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"learner_replay: the replay of {config.name} failed:\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    if len(rows) != steps:
        raise SystemExit(f"learner_replay: {config.name} trained {len(rows)} steps, {steps} expected")
    later = rows[1:]
    return {"config": shown(config), "batch": cfg.learner.batch_size, "threads": rows[0]["threads"],
            "pinned": list(cfg.learner.cpu_affinity), "steps": rows,
            "ratio": statistics.median(r["in_run_s"] / r["alone_s"] for r in later),
            "in_run_per_sample_s": sum(r["in_run_s"] for r in later) / sum(r["samples"] for r in later),
            "alone_per_sample_s": sum(r["alone_s"] for r in later) / sum(r["samples"] for r in later)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--baseline", type=Path, help="the synchronous baseline's config (default: <config>_sync.yaml; 'none': only --config)")
    parser.add_argument("--samples", type=int, default=192, help="trained samples per run, after the warm-up step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(replay(args.worker)))
        return
    start = provenance(sys.argv[1:])
    configs = [args.config]
    if str(args.baseline) != "none":
        baseline = args.baseline or sync_baseline(args.config)
        if not baseline.is_file():
            raise SystemExit(f"learner_replay: no synchronous baseline {baseline} (pass --baseline, or --baseline none)")
        configs.append(baseline)
    sides = []
    for config in configs:
        sides.append(side(config, args.samples, args.seed))
        print(f"learner_replay: {config.name}: the learner took {sides[-1]['ratio']:.2f}x its time alone in the run", flush=True)
    publish(args.out, record_name("learner_replay", args.config), "learner_replay",
            {"samples": args.samples, "seed": args.seed, "sides": sides}, sys.argv[1:], start)


def render(data: dict) -> str:
    lines = [f"The learner's compute per step inside a run against the same batches alone (a fresh process, nothing else running), "
             f"{data['samples']} trained samples after a warm-up step, seed {data['seed']}",
             "",
             "| run | learner | in the run, s a sample | alone, s a sample | in the run / alone, median of steps (range) |",
             "|---|---|---|---|---|"]
    for s in data["sides"]:
        ratios = [r["in_run_s"] / r["alone_s"] for r in s["steps"][1:]]
        where = f"pinned to core {', '.join(map(str, s['pinned']))}" if s["pinned"] else "not pinned"
        lines.append(f"| `{Path(s['config']).name}` | {s['threads']} thread{'s' if s['threads'] > 1 else ''}, {where}, batch {s['batch']} | "
                     f"{s['in_run_per_sample_s']:.3f} | {s['alone_per_sample_s']:.3f} | **{s['ratio']:.2f}x** "
                     f"({min(ratios):.2f}–{max(ratios):.2f}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
