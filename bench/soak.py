"""Soak: a long run with rollout workers killed at random intervals; nothing may be lost silently.

    .venv/bin/python bench/soak.py --minutes 10 --kill-every 60       # the issue's soak
    .venv/bin/python bench/soak.py --minutes 2 --kill-every 20        # a quick one

Starts `python -m asyncrl.run` on the smoke config with enough steps to last
about `--minutes`, SIGKILLs a random rollout worker process every
`--kill-every` seconds (± 50 %) until the run ends, then reads the trajectory
store and reports samples generated, trained, dropped by reason, and lost: the
samples of admitted groups that have no record at all (must be 0), plus ids
recorded twice (must be 0). Writes bench/results/soak.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_io import check_plausible, provenance, publish  # noqa: E402  (bench/ is on sys.path when a benchmark runs as a script)


def rollout_worker_pids() -> list[int]:
    from asyncrl.core.util import pids_named

    return pids_named("ray::RolloutWorker")


def soak(out: Path, args: argparse.Namespace) -> dict:
    from asyncrl.core.config import load_config
    from asyncrl.core.store import read_trajectories

    steps = max(1, int(args.minutes * 60 / args.step_s))
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={out}", f"run.steps={steps}",
           "run.eval=false", f"learner.delay_s={args.step_s}", f"rollout.num_workers={args.workers}", "rollout.max_restarts=1000",
           "logging.console=false", "run.checkpoint_every=0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rng, kills, t0 = random.Random(args.seed), 0, time.monotonic()
    next_kill = t0 + 30 + args.kill_every * rng.uniform(0.5, 1.5)  # let the run start first
    while proc.poll() is None:
        time.sleep(0.5)
        if time.monotonic() >= next_kill:
            victims = rollout_worker_pids()
            if victims:
                try:
                    os.kill(rng.choice(victims), signal.SIGKILL)
                    kills += 1
                except OSError:  # it exited on its own meanwhile
                    pass
            next_kill = time.monotonic() + args.kill_every * rng.uniform(0.5, 1.5)
    output = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"the soak run failed (exit {proc.returncode}):\n{output[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    records = read_trajectories(out / "trajectories").to_pylist()
    ids = Counter(r["sample_id"] for r in records)
    reasons = Counter((r["status"], _reason_kind(r["status_reason"])) for r in records)
    group_size = load_config(ROOT / "configs/smoke.yaml").rollout.group_size
    expected = summary["samples"]["admitted_groups"] * group_size  # every admitted group must end in the record
    return {
        "minutes": round((time.monotonic() - t0) / 60, 2), "steps": steps, "kills": kills, "restarts": summary["rollout_restarts"],
        "recorded": len(records), "admitted_samples": expected, "lost_silently": expected - len(ids),
        "recorded_twice": sum(1 for c in ids.values() if c > 1),
        "trained": sum(1 for r in records if r["status"] == "consumed"),
        "by_status_and_reason": {f"{s} ({k})" if k else s: n for (s, k), n in sorted(reasons.items())},
    }


def _reason_kind(reason: str | None) -> str:
    if not reason:
        return ""
    if "died while generating" in reason:
        return "worker died"
    return reason.split(":")[0][:40]


def render(result: dict) -> str:
    """The table, from the published result alone."""
    lines = [f"Soak: {result['minutes']} min, {result['steps']} steps, {result['kills']} worker kills, {result['restarts']} restarts",
             f"(`{' '.join(['bench/soak.py', *result['argv']])}`)", "",
             f"- samples recorded: {result['recorded']} (admitted: {result['admitted_samples']})",
             f"- trained: {result['trained']}",
             f"- **lost silently: {result['lost_silently']}**, recorded twice: {result['recorded_twice']}",
             "- by status (reason):"] + [f"  - {k}: {v}" for k, v in result["by_status_and_reason"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills (randomised ±50 %%)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--step-s", type=float, default=0.5, help="learner.delay_s: paces the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = soak(Path(tmp) / "run", args)
    check_plausible("soak", result["trained"], result["recorded"], "samples trained (at most those recorded)")
    result["argv"] = sys.argv[1:]
    publish(args.out, "soak", "soak", result, sys.argv[1:], start)
    if result["lost_silently"] or result["recorded_twice"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
