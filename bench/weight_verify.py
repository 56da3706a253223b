"""What verifying the weight syncs costs: the learner's and the engine's fingerprinting against the sync itself.

    .venv/bin/python bench/weight_verify.py --config configs/smollm2_word_problems.yaml --steps 6

One asyncrl run of the config with every parameter sent at each sync (`learner.lora.rank=0`), a sync every step,
one group a step with short answers (the sync is measured, not the training) and verification on (`learner.verify_weights`). From its metrics, for each sync settled during the run (the first
step's publish settles nothing): `time/weight_verify_s` (the learner's CPU time fingerprinting what it sent, while the
buckets are on the wire, one row in `learner.verify_stride` of each matrix, plus the slowest engine's wall time
fingerprinting what it serves, its generation paused) against the sync's own time,
`time/weight_send_s` + `time/weight_load_s`. The ratio is of medians over those syncs. Writes
bench/results/weight_verify_<config>.{json,md}; exits non-zero when a settled sync was not verified on every engine,
found a mismatch (a clean run must not), or a time is not positive.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

from results_io import QUIET, ROOT, provenance, publish, run_asyncrl

TARGET = 0.10
"""Verification's share of the sync's time the design aims under, at 135 M parameters."""
SPLIT = ("time/weight_verify_learner_s", "time/weight_verify_engine_s")
"""Verification's two parts (records before they were logged apart have neither)."""


def summarize(metrics: list[dict]) -> dict:
    """The settled syncs' figures and the ratio of medians; ValueError on an impossible or unverified sync."""
    rows = [m for m in metrics if "sync/verified" in m]
    if not rows:
        raise ValueError("no settled sync was verified: was learner.verify_weights on, and did the run sync twice?")
    for m in rows:
        if m["sync/verified"] != 1.0 or m["sync/mismatches"] != 0:
            raise ValueError(f"step {m['step']}: verified {m['sync/verified']}, mismatches {m['sync/mismatches']} (a clean run must verify every engine)")
        if min(m["time/weight_verify_s"], m["time/weight_send_s"], m["time/weight_load_s"]) <= 0:
            raise ValueError(f"step {m['step']}: a time that is not positive ({m})")
    keys = [k for k in ("time/weight_verify_s", "time/weight_send_s", "time/weight_load_s", *SPLIT) if all(k in m for m in rows)]
    med = {k: statistics.median(m[k] for m in rows) for k in keys}
    return {"syncs": len(rows), "bytes": rows[-1]["weights/sync_bytes"], **med,
            "ratio": med["time/weight_verify_s"] / (med["time/weight_send_s"] + med["time/weight_load_s"]),
            "per_sync": [{k: m[k] for k in ("step", *keys)} for m in rows]}


def _rows_checked(stride: int | None) -> str:
    """What the learner checked (`learner.verify_stride`; records before it have none)."""
    if stride is None:
        return ""
    return ", every row checked" if stride == 1 else f"; the learner checks one row in {stride} of each matrix, a different share each sync"


def render(data: dict) -> str:
    r = data
    split = all(k in r for k in SPLIT)
    parts = (f" ({1000 * r[SPLIT[0]]:.0f} ms learner CPU, {1000 * r[SPLIT[1]]:.0f} ms engine)" if split
             else " (not recorded apart)")
    return "\n".join([
        f"Verifying each weight sync, `{r['config']}` with every parameter sent ({r['bytes'] / 2**20:.0f} MiB a sync), "
        f"medians over {r['syncs']} settled syncs of one run{_rows_checked(r.get('verify_stride'))}:", "",
        "| learner + engine fingerprinting | learner send | engine receive and load | verification / sync | target |",
        "|---|---|---|---|---|",
        f"| {1000 * r['time/weight_verify_s']:.0f} ms{parts} | {1000 * r['time/weight_send_s']:.0f} ms | "
        f"{1000 * r['time/weight_load_s']:.0f} ms | {r['ratio']:.3f} | ≤ {TARGET:.2f} |", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/smollm2_word_problems.yaml"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    run_dir = Path("bench") / "work" / f"weight_verify_{args.config.stem}"
    overrides = [*QUIET, "learner.lora.rank=0", "learner.sync_every=1", "learner.verify_weights=true", f"run.steps={args.steps}",
                 "learner.batch_size=8", "learner.micro_batch_size=4", "rollout.max_new_tokens=64",  # the sync is measured, not the training
                 f"run.output_dir={run_dir}"]
    shutil.rmtree(ROOT / run_dir, ignore_errors=True)  # scratch: a run left there would resume from its checkpoint
    run_asyncrl(args.config, overrides)
    from asyncrl.analysis.runs import load_run

    run = load_run(ROOT / run_dir)
    result = {"config": str(args.config), "overrides": overrides, "verify_stride": run.config["learner"]["verify_stride"],
              **summarize(run.metrics)}
    publish(args.out, f"weight_verify_{args.config.stem}", "weight_verify", result, sys.argv[1:], start)


if __name__ == "__main__":
    main()
