"""Length drift: does the asynchronous recipe's response length grow where its synchronous baseline's falls, and
which of its settings makes it grow?

Seen in the time-to-accuracy protocol's runs (docs/benchmarks.md): on the same prompt stream, seed and learning
rate, the asynchronous side's answers grew (test seed 1: 48 -> 87 tokens, a third of them cut at
`rollout.max_new_tokens`) while the synchronous side's shrank (46 -> 24); at 1e-3 the asynchronous dev run grew
until every answer was cut and no token carried loss. But the same seed-1 run made again (the `recipe` variant,
2026-12-07) shrank its answers to 17 tokens: one run per variant says little, repeat them (`--seed`, or the same
seed again) before reading a difference between variants. Each variant here trains the same number of samples on the
same stream and reads its trajectory store, nothing evaluated (no held-out problem is scored):

- recipe: configs/smollm2_word_problems.yaml as the protocol runs it (`buffer.max_staleness=3`)
- no_mask: the recipe with `algorithm.mask_truncated=false` (cut answers carry loss, mostly a negative advantage)
- no_wait: the recipe with `buffer.expiring_wait_s=0` (the long groups past the bound are dropped, not waited for)
- staleness_1: the recipe with `buffer.max_staleness=1`
- no_keep_kv: the recipe with `rollout.keep_kv=false` (a weight load re-prefills the running requests under the new
  weights instead of going on with the KV the old ones computed)
- sync: the colocated synchronous baseline (configs/smollm2_word_problems_sync.yaml) at the same learning rate

Per variant: the mean length of the trained answers in each eighth of training, the share cut at the cap in the
second half, the reward in each half, and the length push: over the trained answers of every group with mixed
rewards, the sum of (group-standardised reward) x (answer length), per trained answer. Positive: within their
groups, the trained answers that scored better are the longer ones, so the update favours longer answers; cut
answers are left out where `mask_truncated` leaves them no loss.

    .venv/bin/python bench/length_drift.py                      # 6 x (about 12 min of training + 1 min start-up)
    .venv/bin/python bench/length_drift.py --variants recipe sync --seed 1

Writes bench/results/length_drift.{md,json} (`--name` changes the stem) again as each variant ends.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from length_bias import run_job  # bench/ is on sys.path when a benchmark runs as a script
from results_io import provenance, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE, SYNC = "configs/smollm2_word_problems.yaml", "configs/smollm2_word_problems_sync.yaml"
VARIANTS = {
    "recipe": (RECIPE, []),
    "no_mask": (RECIPE, ["algorithm.mask_truncated=false"]),
    "no_wait": (RECIPE, ["buffer.expiring_wait_s=0"]),
    "staleness_1": (RECIPE, ["buffer.max_staleness=1"]),
    "no_keep_kv": (RECIPE, ["rollout.keep_kv=false"]),
    "sync": (SYNC, []),
}
BINS = 8


# ----------------------------------------------------------------------------- pure logic (tested)
def standardised(rewards: list[float]) -> list[float]:
    """Group-standardised rewards: (r - mean) / (population std + 1e-6); all 0 if every reward is equal. The learner's
    GRPO advantages (algorithms.base.group_relative_advantages) divide by the sample std instead: for a fixed group
    size the two differ by one constant factor, which leaves the length push's sign and ranking as they are."""
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [0.0] * len(rewards) if std == 0 else [(r - mean) / (std + 1e-6) for r in rewards]


def trained_groups(rows: list[dict]) -> list[list[dict]]:
    """The groups trained on (status consumed), each in its records' order, ordered by the step that took them."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == "consumed":
            groups.setdefault(r["group_id"], []).append(r)
    return sorted(groups.values(), key=lambda g: g[0]["consumed_step"])


def length_push(groups: list[list[dict]], mask_truncated: bool) -> float:
    """Sum over the trained answers of (group-standardised reward) x (length in tokens), per trained answer; answers
    cut at the cap are left out where `mask_truncated` gives them no loss (they still count in their group's statistics)."""
    total, trained = 0.0, 0
    for group in groups:
        for r, adv in zip(group, standardised([float(x["reward"]) for x in group])):
            if mask_truncated and r["finish_reason"] == "length":
                continue
            total += adv * len(r["response_ids"])
            trained += 1
    return total / trained if trained else 0.0


def by_bins(groups: list[list[dict]], value, bins: int = BINS) -> list[float]:
    """The mean of `value(record)` over the trained records of each of `bins` equal runs of consumed steps (NaN where
    a bin took none)."""
    steps = [g[0]["consumed_step"] for g in groups]
    if not steps:
        return [float("nan")] * bins
    lo, span = min(steps), max(steps) - min(steps) + 1
    sums, counts = [0.0] * bins, [0] * bins
    for group in groups:
        k = min(bins - 1, (group[0]["consumed_step"] - lo) * bins // span)
        for r in group:
            sums[k] += value(r)
            counts[k] += 1
    return [s / c if c else float("nan") for s, c in zip(sums, counts)]


def summarize(rows: list[dict], mask_truncated: bool) -> dict:
    """A variant's figures from its trajectory records."""
    groups = trained_groups(rows)
    lengths = by_bins(groups, lambda r: len(r["response_ids"]))
    cut = by_bins(groups, lambda r: float(r["finish_reason"] == "length"), 2)
    reward = by_bins(groups, lambda r: float(r["reward"]), 2)
    return {"trained": sum(len(g) for g in groups), "dropped_stale": sum(r["status"] == "dropped_stale" for r in rows),
            "length_by_eighth": lengths, "cut_second_half": cut[1], "reward_by_half": reward,
            "length_push": length_push(groups, mask_truncated)}


# ----------------------------------------------------------------------------- runs
def run_variant(out: Path, variant: str, args: argparse.Namespace) -> dict:
    from asyncrl.core.config import load_config

    config, extra = VARIANTS[variant]
    overrides = [f"run.seed={args.seed}", f"learner.lr={args.lr}", "run.max_train_minutes=0",
                 "task.dev_size=200", "model.dtype=float32", "algorithm.kl_ref_every=0", *extra]
    cfg = load_config(ROOT / config, overrides)
    if args.samples % cfg.learner.batch_size:
        raise SystemExit(f"length_drift: --samples {args.samples} is not whole batches of {cfg.learner.batch_size} ({variant})")
    rows, summary = run_job(config, out, [*overrides, f"run.steps={args.samples // cfg.learner.batch_size}"], 3 * 3600)
    return {"variant": variant, "config": config, "overrides": extra, "max_staleness": cfg.buffer.max_staleness,
            "steps": summary["steps"], "wall_s": summary["wall_s"], **summarize(rows, cfg.algorithm.mask_truncated)}


def render(result: dict) -> str:
    """The table, from the published result alone."""
    a = result["args"]
    lines = [f"Length drift: {a['samples']} trained samples per variant, seed {a['seed']}, learning rate {a['lr']}, float32 "
             f"(`{' '.join(['bench/length_drift.py', *result['argv']])}`)", "",
             "| variant | staleness bound | mean trained length, each eighth of training | cut, 2nd half | reward, 1st → 2nd half "
             "| length push | dropped stale | wall s |", "|" + "---|" * 8]
    for r in result["results"]:
        lengths = " ".join(f"{v:.0f}" for v in r["length_by_eighth"])
        lines.append(f"| {r['variant']} | {r['max_staleness']} | {lengths} | {r['cut_second_half']:.2f} "
                     f"| {r['reward_by_half'][0]:.3f} → {r['reward_by_half'][1]:.3f} | {r['length_push']:+.1f} "
                     f"| {r['dropped_stale']} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--samples", type=int, default=1024, help="trained samples per variant (the protocol's)")
    parser.add_argument("--seed", type=int, default=1, help="run.seed: the prompt stream (the protocol's test seed 1 drifted)")
    parser.add_argument("--lr", default="5e-4", help="learner.lr for every variant (the protocol's asynchronous rate)")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="length_drift", help="result file stem")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    results = []
    with tempfile.TemporaryDirectory(prefix="length-drift-") as tmp:
        work = args.keep or Path(tmp)
        for variant in args.variants:  # the record is written again as each variant ends: a stopped run keeps its variants
            results.append(run_variant(work / variant, variant, args))
            print(f"{variant}: {json.dumps(results[-1])}", flush=True)
            data = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results, "argv": sys.argv[1:]}
            publish(args.out, args.name, "length_drift", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
