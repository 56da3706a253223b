"""Soak: a run under a random fault a minute; every fault recovered from, nothing lost, nothing trained twice.

    .venv/bin/python bench/soak.py --minutes 10 --every 60                        # SmolLM2's recipe, the acceptance soak
    .venv/bin/python bench/soak.py --config configs/smoke.yaml --minutes 4 --every 30   # the tiny model, a quick one

Starts `python -m asyncrl.run` on `--config` with two rollout workers (the pool may go from 1 to 3), a reward actor
and checkpoints every few steps, for `--minutes` of training (run.max_train_minutes). Every `--every` seconds
(± 50 %), once the previous fault has been recovered from, it injects one fault drawn at random (seeded) among:

- `engine_kill`: SIGKILL a rollout worker's process (its engine dies with it): the worker is replaced;
- `engine_freeze`: SIGSTOP a rollout worker's process: the controller's poll gives up on it and replaces it;
- `reward_kill`: SIGKILL the reward actor's process: Ray restarts it, its groups are handed over again;
- `learner_kill`: SIGKILL a learner rank: the learner group is restored in place from the last checkpoint;
- `worker_added`, `worker_removed`: `asyncrl scale RUN N±1`, as a user types it.

Each fault is recovered from when the run says so: `rollout/restarts_total` or `learner/restarts_total` goes up,
`rollout/workers` reaches the size asked for, or the reward actor is back (its process counted again). Reported:
faults injected and recovered, time to recover (median and max) per kind, and from the trajectory store: samples
lost silently (admitted and never recorded), recorded twice, trained twice, and trained past the staleness bound
(each must be 0). Writes bench/results/soak_<config>[_seed<N>].{json,md}; exits 1 when any of those is not 0 or a fault was not
recovered from.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_io import check_plausible, provenance, publish  # noqa: E402  (bench/ is on sys.path when a benchmark runs as a script)

KINDS = ("engine_kill", "engine_freeze", "reward_kill", "learner_kill", "worker_added", "worker_removed")
TAG = "ASYNCRL_SOAK_RUN"


# ----------------------------------------------------------------------------- pure logic (tested)
def possible(kinds: tuple[str, ...], workers: int, lo: int, hi: int) -> list[str]:
    """The faults that can be injected with `workers` rollout workers serving, the pool bounded by [lo, hi]."""
    return [k for k in kinds if not (k == "worker_added" and workers >= hi) and not (k == "worker_removed" and workers <= lo)]


def recovered(kind: str, before: dict, row: dict, want_workers: int | None) -> bool:
    """Whether metrics `row` shows the run recovered from `kind`, injected when the last row was `before`."""
    if kind in ("engine_kill", "engine_freeze"):
        return row.get("rollout/restarts_total", 0) > before.get("rollout/restarts_total", 0)
    if kind == "learner_kill":
        return row.get("learner/restarts_total", 0) > before.get("learner/restarts_total", 0)
    if kind in ("worker_added", "worker_removed"):
        return row.get("rollout/workers") == want_workers and not row.get("rollout/workers_starting") and not row.get("rollout/workers_retiring")
    raise ValueError(kind)


def audit(records: list[dict], admitted_groups: int, group_size: int, max_staleness: int) -> dict:
    """From the trajectory store: samples lost silently, recorded twice, trained twice, trained past the bound."""
    ids = Counter(r["sample_id"] for r in records)
    consumed = Counter(r["sample_id"] for r in records if r["status"] == "consumed")
    return {
        "recorded": len(records), "admitted_samples": admitted_groups * group_size,
        "lost_silently": admitted_groups * group_size - len(ids), "recorded_twice": sum(c > 1 for c in ids.values()),
        "trained": sum(consumed.values()), "trained_twice": sum(c > 1 for c in consumed.values()),
        "staleness_violations": sum(1 for r in records if r["status"] == "consumed"
                                    and r["consumed_version"] - r["policy_version_start"] > max_staleness),
        "by_status": dict(sorted(Counter(r["status"] for r in records).items())),
    }


def render(result: dict) -> str:
    """The table, from the published result alone."""
    f = [x for x in result["faults"] if not x.get("cut_by_end")]
    cut = len(result["faults"]) - len(f)
    lines = [f"Soak: `{result['config']}`, {result['minutes']} min of training, {result['steps']} steps, a fault every "
             f"{result['every_s']:g} s (± 50 %), seed {result['seed']}: **{sum(x['recovered'] for x in f)} of {len(f)} faults recovered from**"
             + (f" (and {cut} injected too late to see: the run's time ran out first)." if cut else "."), "",
             "| fault | injected | recovered | time to recover, median / max (s) |", "|---|---|---|---|"]
    for kind in KINDS:
        mine = [x for x in f if x["kind"] == kind]
        times = [x["recover_s"] for x in mine if x["recovered"]]
        spread = f"{statistics.median(times):.1f} / {max(times):.1f}" if times else "–"
        lines.append(f"| {kind} | {len(mine)} | {sum(x['recovered'] for x in mine)} | {spread} |")
    a = result["audit"]
    lines += ["", f"Samples: {a['recorded']} recorded ({a['admitted_samples']} admitted), {a['trained']} trained; "
              f"**lost silently {a['lost_silently']}, recorded twice {a['recorded_twice']}, trained twice {a['trained_twice']}, "
              f"past the staleness bound {a['staleness_violations']}**. By status: "
              + ", ".join(f"{k} {v}" for k, v in a["by_status"].items()) + "."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- measurement
def pids(prefix: str, out: Path) -> list[int]:
    from asyncrl.core.util import pids_named

    return pids_named(prefix, environ=f"{TAG}={out}")


def rows_of(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return rows


def inject(kind: str, out: Path, rng: random.Random, workers: int) -> tuple[str, int | None]:
    """Do `kind` to the run; (what was done, the pool size asked for or None)."""
    if kind in ("worker_added", "worker_removed"):
        n = workers + (1 if kind == "worker_added" else -1)
        proc = subprocess.run([str(Path(sys.executable).parent / "asyncrl"), "scale", str(out), str(n)], capture_output=True, text=True, timeout=120)
        if proc.returncode:
            raise RuntimeError(f"asyncrl scale failed: {proc.stderr}")
        return f"asyncrl scale {n}", n
    prefix, sig = {"engine_kill": ("ray::RolloutWorker", signal.SIGKILL), "engine_freeze": ("ray::RolloutWorker", signal.SIGSTOP),
                   "reward_kill": ("ray::RewardWorker", signal.SIGKILL), "learner_kill": ("ray::Learner", signal.SIGKILL)}[kind]
    victims = pids(prefix, out)
    if not victims:
        raise RuntimeError(f"no {prefix} process to {kind}")
    pid = rng.choice(sorted(victims))
    os.kill(pid, sig)
    return f"{sig.name} {prefix} pid {pid}", None


def soak(out: Path, args: argparse.Namespace) -> dict:
    from asyncrl.core.config import load_config
    from asyncrl.core.store import read_trajectories

    sets = ["rollout.num_workers=2", "rollout.min_workers=1", "rollout.max_workers=3", "rollout.max_restarts=1000", "rollout.num_cpus=0.5",
            "reward.num_workers=1", "reward.num_cpus=0", "learner.max_restarts=1000", "run.checkpoint_every=5", "run.eval=false",
            "run.steps=1000000", f"run.max_train_minutes={args.minutes}", "logging.wandb=false", "logging.console=false", *args.set]
    cfg = load_config(ROOT / args.config, sets)
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", args.config, f"run.output_dir={out}", *sets]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, TAG: str(out)})
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()
    rng, faults, t0 = random.Random(args.seed), [], time.monotonic()
    workers, pending = cfg.rollout.num_workers, None
    while len(rows_of(out)) < 2 and proc.poll() is None:  # the run is up and training
        time.sleep(1)
    next_at = time.monotonic() + args.every * rng.uniform(0.5, 1.5)
    last_at = time.monotonic() + args.minutes * 60 - args.quiet_s  # no fault in the last quiet_s of training
    while proc.poll() is None:
        time.sleep(0.5)
        rows = rows_of(out)
        if pending is not None:
            fault, before, want = pending
            if fault["kind"] == "reward_kill":
                back = len(pids("ray::RewardWorker", out)) >= cfg.reward.num_workers
            else:
                back = bool(rows) and recovered(fault["kind"], before, rows[-1], want)
            if back:
                fault.update(recovered=True, recover_s=round(time.monotonic() - fault["t"], 1))
                workers = rows[-1].get("rollout/workers", workers)
                pending = None
                next_at = time.monotonic() + args.every * rng.uniform(0.5, 1.5)
            continue
        if time.monotonic() < next_at or not rows or time.monotonic() > last_at:
            continue
        kind = rng.choice(possible(args.kinds, workers, cfg.rollout.min_workers, cfg.rollout.max_workers))
        try:
            what, want = inject(kind, out, rng, workers)
        except (RuntimeError, OSError) as exc:  # the process ended meanwhile: draw again later
            print(f"soak: {kind} not injected: {exc}", flush=True)
            next_at = time.monotonic() + 5
            continue
        fault = {"kind": kind, "what": what, "t": time.monotonic(), "at_s": round(time.monotonic() - t0, 1), "step": rows[-1]["step"],
                 "recovered": False, "recover_s": None}
        print(f"soak: {fault['at_s']:.0f} s, step {fault['step']}: {kind} ({what})", flush=True)
        faults.append(fault)
        pending = (fault, rows[-1], want)
    if proc.returncode != 0:
        raise RuntimeError(f"the soak run failed (exit {proc.returncode}):\n{''.join(log)[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    records = read_trajectories(out / "trajectories").to_pylist()
    for f in faults:
        f.pop("t")
    if pending is not None:  # the run's time ran out before it showed the recovery: not counted either way
        pending[0]["cut_by_end"] = True
    return {"config": args.config, "minutes": args.minutes, "every_s": args.every, "seed": args.seed, "steps": summary["steps"],
            "faults": faults, "audit": audit(records, summary["samples"]["admitted_groups"], cfg.rollout.group_size, cfg.buffer.max_staleness),
            "summary": {k: summary.get(k) for k in ("rollout_restarts", "learner_restarts", "pool_changes", "watchdog", "samples")},
            "argv": sys.argv[1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smollm2_word_problems.yaml")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time (run.max_train_minutes)")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between faults (randomised ± 50 %%), once the last is recovered from")
    parser.add_argument("--quiet-s", type=float, default=60.0, help="no fault in the last this many seconds of training")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for the run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    args.kinds = tuple(args.kinds)
    start = provenance(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = soak(Path(tmp) / "run", args)
    a = result["audit"]
    check_plausible("soak", a["trained"], a["recorded"], "samples trained (at most those recorded)")
    publish(args.out, f"soak_{Path(args.config).stem}" + (f"_seed{args.seed}" if args.seed else ""), "soak", result, sys.argv[1:], start)
    if a["lost_silently"] or a["recorded_twice"] or a["trained_twice"] or a["staleness_violations"] or \
            not all(f["recovered"] or f.get("cut_by_end") for f in result["faults"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
