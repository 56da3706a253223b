"""Seed-level figures of bench/vs_trl.py's runs: median (range) over seeds of time to the threshold, per side.

    .venv/bin/python bench/vs_trl_seeds.py --name smollm2_test \\
        bench/results/vs_trl_smollm2_word_problems_test-s0.json bench/results/vs_trl_smollm2_word_problems_test-s1.json ...

Each input is the record of one `bench/vs_trl.py ... --tag T` run (one seed, every side of it back to back). The
records must share their threshold, split, config and sides: the figures of one protocol step, fixed before the
runs. Per side: the seconds to the threshold of each seed (a seed that never reached it counts as slower than any
that did), trained samples per second, the accuracy at the last snapshot and its gain over the untrained model
(what a side learned from the same number of samples, whether or not it reached the threshold); per TRL side:
asyncrl's speedup in each seed where both reached it, and its trained samples/s over the side's in every seed.
Medians with the range over seeds. Writes bench/results/vs_trl_seeds_<name>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from results_io import provenance, publish  # bench/ is on sys.path when a benchmark runs as a script
from vs_trl import SIDE_NAMES, final_accuracy  # its module level is constants and pure functions: nothing heavy is imported

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"asyncrl": "asyncrl", **SIDE_NAMES}  # every side's key in a vs_trl record -> its column
SAME = ("threshold", "split", "config", "trl_config", "sync_config")


def final_and_gain(side: dict) -> dict:
    """A side's accuracy at its last snapshot and that minus its untrained (step 0) accuracy."""
    start = [p["accuracy"] for p in side["points"] if p["step"] == 0]
    if not start:
        raise ValueError("a side's points lack the untrained model's (step 0) accuracy")
    final = final_accuracy(side)
    return {"final_accuracy": final, "gain": final - start[0]}


def summarize(results: list[dict]) -> dict:
    """One protocol step's seeds (vs_trl results), checked alike: per side the per-seed figures."""
    if not results:
        raise ValueError("no runs to summarize")
    for key in SAME:
        values = {json.dumps(r.get(key)) for r in results}
        if len(values) > 1:
            raise ValueError(f"the runs differ in {key} ({', '.join(sorted(values))}): not one protocol step")
    sides = [k for k in SIDES if k in results[0]]
    if any([k for k in SIDES if k in r] != sides for r in results):
        raise ValueError("the runs do not all have the same sides")
    per_side = {}
    for side in sides:
        per_side[side] = [{"overrides": r.get("overrides", []),
                           "time_s": (r[side]["time_to_threshold"] or {}).get("train_s"),
                           "samples_per_s": r[side]["samples_per_s"], **final_and_gain(r[side])} for r in results]
    # a seed whose untrained model already met the threshold (every side shares its step 0) times nothing
    at_start = [i for i, r in enumerate(results) if (r["asyncrl"]["time_to_threshold"] or {}).get("step") == 0]
    speedups = {side: [None if i in at_start or not a["time_s"] or t["time_s"] is None else t["time_s"] / a["time_s"]
                       for i, (a, t) in enumerate(zip(per_side["asyncrl"], per_side[side]))] for side in sides if side != "asyncrl"}
    # asyncrl's trained samples a second over each side's, seed by seed (every seed counts: no threshold involved)
    rate_ratios = {side: [a["samples_per_s"] / t["samples_per_s"] for a, t in zip(per_side["asyncrl"], per_side[side])]
                   for side in sides if side != "asyncrl"}
    return {"threshold": results[0]["threshold"], "split": results[0].get("split", "test"), "config": results[0]["config"],
            "runs": len(results), "sides": per_side, "speedup_over": speedups, "rate_ratio_over": rate_ratios,
            "at_start": at_start}


def median_range(values: list[float | None], fmt: str) -> str:
    """`median (min-max)`; None is "not reached", ranked above every number; an even count takes the lower middle
    value (the conservative one for a speedup)."""
    ranked = sorted(math.inf if v is None else v for v in values)
    med = statistics.median_low(ranked) if len(ranked) % 2 == 0 else statistics.median(ranked)
    show = lambda v: "not reached" if math.isinf(v) else format(v, fmt)  # noqa: E731
    return f"{show(med)} ({show(ranked[0])}–{show(ranked[-1])})"


def render(data: dict) -> str:
    names = [SIDES[s] for s in data["sides"]]
    lines = [f"`{Path(data['config']).name}`, {data['runs']} seeds, time to {data['split']} accuracy ≥ {data['threshold']:.2f}: "
             "median (range) over seeds (a seed that never reached it ranks last)", "",
             f"| | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    rows = data["sides"].values()
    lines.append("| seconds to the threshold | " + " | ".join(median_range([s["time_s"] for s in side], ".0f") for side in rows) + " |")
    lines.append("| trained samples/s | " + " | ".join(median_range([s["samples_per_s"] for s in side], ".2f") for side in rows) + " |")
    lines.append(f"| {data['split']} accuracy at the last snapshot | "
                 + " | ".join(median_range([s["final_accuracy"] for s in side], ".3f") for side in rows) + " |")
    lines.append("| its gain over the model before training | "
                 + " | ".join(median_range([s["gain"] for s in side], "+.3f") for side in rows) + " |")
    for side, values in data["speedup_over"].items():
        reached = [v for v in values if v is not None]
        cell = median_range(reached, ".2f") if reached else "–"
        lines.append(f"\nasyncrl / {SIDES[side]}, time to the threshold, seeds where both reached it after training "
                     f"({len(reached)} of {len(values)}): **{cell}**")
    for side, ratios in data.get("rate_ratio_over", {}).items():
        lines.append(f"\nasyncrl / {SIDES[side]}, trained samples/s, every seed ({len(ratios)}): **{median_range(ratios, '.2f')}**")
    if data.get("at_start"):
        lines.append(f"\nIn {len(data['at_start'])} of {data['runs']} seeds the untrained model was already at the threshold "
                     "on these problems (every side at 0 s): they time nothing and are left out of the speedups.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path, help="vs_trl result records (bench/results/vs_trl_*_<tag>.json)")
    parser.add_argument("--name", required=True, help="names the output: bench/results/vs_trl_seeds_<name>")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    results = [json.loads(p.read_text())["result"] for p in args.records]
    try:
        data = summarize(results)
    except ValueError as exc:
        raise SystemExit(f"vs_trl_seeds: {exc}")
    data["records"] = [str(p) for p in args.records]
    publish(args.out, f"vs_trl_seeds_{args.name}", "vs_trl_seeds", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
