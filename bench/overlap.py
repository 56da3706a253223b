"""Asynchronous against the synchronous baseline its users would run, per trained sample, over several seeds.

    .venv/bin/python bench/overlap.py                     # the tiny default job, 3 seeds, about 6 min on 2 cores
    .venv/bin/python bench/overlap.py --config configs/smollm2_word_problems.yaml --samples 192   # about 40 min

For each seed, back to back (the order alternating from seed to seed), the asynchronous job (`--config`) and its
synchronous baseline (`--baseline`; by default the config's `<name>_sync.yaml`): the same model, task, sampling,
algorithm and optimizer-update size, scheduled as verl's colocated trainer and TRL schedule it (generation of a
whole rollout batch at full engine concurrency on every core, then several optimizer updates on it, in turn;
`buffer.max_staleness=0`). Both train `--samples` samples after a first, warm-up step (not counted).

Per sample, from each run's own metrics (`asyncrl.analysis.bounds`):
- the time each run took (the sum of its step times over the trained samples) and their ratio, the speedup;
- the async run's phases: generation work (its engine's busy time over the samples it generated), learner compute
  and the sync on the learner's path; a perfect pipeline of its two pools takes the longer of the two: the ideal
  speedup is the baseline's time over that, the efficiency that over the async run's time (at most 1: a figure
  above 1.05 fails the benchmark, as does a pair of runs that differ in anything but scheduling, or a baseline
  that dropped a stale sample);
- how each phase's time per sample changed from one core (async) to two in turn (baseline): what the split of the
  machine costs or gains (`bounds.split_bound`).

Writes bench/results/overlap.{json,md}, or overlap_<config name>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from results_io import lengths_text, provenance, publish, record_name, run_samples, shown, sync_baseline  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_job(config: Path, out: Path, samples: int, seed: int) -> dict:
    """Run `config` for a warm-up step and then `samples` trained samples; its measures (`measure`)."""
    run_samples(config, out, samples, seed)
    return measure(out)


def measure(run_dir: Path) -> dict:
    """Totals over the steps after the first (warm-up: engine and learner start cold) of one run."""
    import yaml

    from asyncrl.analysis.runs import load_run, response_lengths

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, later = rows[0], rows[1:]
    summary = json.loads((run_dir / "summary.json").read_text())

    def total(key: str) -> float:
        return sum(r[key] for r in later)

    return {
        "config": yaml.safe_load((run_dir / "config.yaml").read_text()),
        "steps": len(later), "samples": total("samples/trained"), "wall_s": total("time/step_s"),
        "learner_wait_s": total("time/learner_wait_s"), "learner_compute_s": total("time/learner_compute_s"),
        "weight_sync_s": total("time/weight_sync_s"),
        "rollout_busy_s": later[-1]["rollout/busy_s_total"] - first["rollout/busy_s_total"],
        "generated": later[-1]["samples/generated_total"] - first["samples/generated_total"],
        "running_mean": statistics.mean(r["rollout/running_mean"] for r in later if "rollout/running_mean" in r) if "rollout/running_mean" in later[0] else None,
        "dropped_stale": summary["samples"]["dropped_stale"], "refused_admissions": summary["samples"]["refused_admissions"],
        "run_wall_s": summary["wall_s"], "response_lengths": response_lengths(load_run(run_dir).trajectories),
    }


def per_sample(m: dict) -> dict:
    """A run's time and phases per sample (generation: per generated sample).

    The run's time per sample counts only the samples the pipeline both generated and trained in the window:
    wall / min(trained, generated). An engine-bound asynchronous run trains, within a short window, samples its
    engine generated before it (the buffer it filled while the learner's first step ran cold); its sustained rate
    is the engine's, and dividing by the trained count would credit it with draining that buffer. So the time per
    sample is never below either pool's work per sample (engine busy time over generated, learner time over trained),
    and the efficiency against their bound is at most 1 by construction. A synchronous run generates what it trains."""
    n = m["samples"]
    return {"run_s": m["wall_s"] / max(min(n, m["generated"]), 1), "run_s_trained": m["wall_s"] / n,
            "gen_s": m["rollout_busy_s"] / max(m["generated"], 1), "wait_s": m["learner_wait_s"] / n,
            "train_s": m["learner_compute_s"] / n, "sync_s": m["weight_sync_s"] / n}


def compare(asyn: dict, sync: dict) -> dict:
    """The speedup of one seed's pair, its ideal and the efficiency; raises on a pair that may not be compared."""
    from asyncrl.analysis.bounds import Phases, check_efficiency, efficiency, ideal_speedup, unlike

    differ = unlike(asyn["config"], sync["config"])
    if differ:
        raise SystemExit(f"overlap: the two runs differ in more than scheduling ({', '.join(differ)}): no ratio is reported")
    if sync["dropped_stale"]:
        raise SystemExit(f"overlap: the synchronous baseline dropped {sync['dropped_stale']} stale samples: it is not synchronous")
    a, s = per_sample(asyn), per_sample(sync)
    phases = Phases(gen_s=a["gen_s"], train_s=a["train_s"], sync_s=a["sync_s"])
    out = {"speedup": s["run_s"] / a["run_s"], "ideal": ideal_speedup(s["run_s"], phases), "efficiency": efficiency(a["run_s"], phases),
           "async": a, "sync": s, "gen_scaling": a["gen_s"] / s["wait_s"], "train_scaling": a["train_s"] / s["train_s"]}
    check_efficiency(out["efficiency"], f"seed {asyn['config']['run']['seed']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--baseline", type=Path, help="the synchronous baseline's config (default: <config>_sync.yaml)")
    parser.add_argument("--samples", type=int, default=1024, help="trained samples per run, after the warm-up step")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--tag", help="appended to the record's name (overlap_<config>_<tag>), to keep another run of it beside the first")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    baseline = args.baseline or sync_baseline(args.config)
    seeds = []
    with tempfile.TemporaryDirectory(prefix="overlap-") as tmp:
        for k, seed in enumerate(args.seeds):
            order = [("async", args.config), ("sync", baseline)]
            runs = {}
            for mode, config in order if k % 2 == 0 else order[::-1]:  # alternate, so a drift of the machine cancels
                runs[mode] = run_job(config, Path(tmp) / f"{mode}-{seed}", args.samples, seed)
                print(f"overlap: seed {seed} {mode}: {per_sample(runs[mode])['run_s']:.3f} s a sample "
                      f"({runs[mode]['samples']:.0f} trained, {runs[mode]['generated']} generated)", flush=True)
            seeds.append({"seed": seed, "first": "async" if k % 2 == 0 else "sync", **compare(runs["async"], runs["sync"]),
                          "runs": {m: {k2: v for k2, v in r.items() if k2 != "config"} for m, r in runs.items()}})
    data = {"config": shown(args.config),
            "baseline": shown(baseline), "samples": args.samples,
            "async_batch": runs["async"]["config"]["learner"]["batch_size"], "sync_batch": runs["sync"]["config"]["learner"]["batch_size"],
            "sync_mini_batches": runs["sync"]["config"]["learner"]["mini_batches"], "seeds": seeds}
    publish(args.out, record_name("overlap", args.config, args.tag), "overlap", data, sys.argv[1:], start)


def _median_range(values: list[float], fmt: str) -> str:
    """The median over seeds and the range of the seeds: `1.10x (1.02-1.15)`."""
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def _ms(seconds: float) -> str:
    """Milliseconds, with three significant digits where they are few."""
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def render(data: dict) -> str:
    seeds = data["seeds"]
    col = {key: [s[key] for s in seeds] for key in ("speedup", "ideal", "efficiency")}
    rate = {m: [1 / s[m]["run_s"] for s in seeds] for m in ("sync", "async")}
    lines = [
        f"Asynchronous `{Path(data['config']).name}` against its synchronous baseline `{Path(data['baseline']).name}` "
        f"(generation and training in turn on every core; a batch of {data['sync_batch']} samples, "
        f"{data['sync_mini_batches']} optimizer updates on it; the async run trains batches of {data['async_batch']}): "
        f"{data['samples']} trained samples per run after a warm-up step, seeds {', '.join(str(s['seed']) for s in seeds)}, back to back.",
        "",
        f"| over {len(seeds)} seeds: median (range) | value |", "|---|---|",
        f"| trained samples/s, synchronous baseline | {_median_range(rate['sync'], '.3f')} |",
        f"| trained samples/s, asynchronous | {_median_range(rate['async'], '.3f')} |",
        f"| **speedup** (async / sync samples/s) | **{_median_range(col['speedup'], '.2f')}** |",
        f"| ideal speedup (sync time / the async run's pipeline bound) | {_median_range(col['ideal'], '.2f')} |",
        f"| **efficiency** (pipeline bound / async time; at most 1) | **{_median_range(col['efficiency'], '.2f')}** |",
        f"| a phase on one core (async) against both cores in turn (sync): generation work / learner compute | "
        f"{_median_range([s['gen_scaling'] for s in seeds], '.2f')}x / {_median_range([s['train_scaling'] for s in seeds], '.2f')}x faster |",
        "",
        "| seed (first run) | sync ms/sample: gen wait + train + sync | async ms/sample | async phases, ms/sample: gen / train + sync "
        "| speedup | ideal | efficiency | dropped stale, sync / async | admission calls refused per minute, sync / async |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in seeds:
        a, y = s["async"], s["sync"]
        ra, rs = s["runs"]["async"], s["runs"]["sync"]
        lines.append(
            f"| {s['seed']} ({s['first']}) | {_ms(y['run_s'])}: {_ms(y['wait_s'])} + {_ms(y['train_s'])} + {_ms(y['sync_s'])} | {_ms(a['run_s'])} | "
            f"{_ms(a['gen_s'])} / {_ms(a['train_s'])} + {_ms(a['sync_s'])} | {s['speedup']:.2f}x | {s['ideal']:.2f}x | {s['efficiency']:.2f} | "
            f"{rs['dropped_stale']} / {ra['dropped_stale']} | {60 * rs['refused_admissions'] / rs['run_wall_s']:.1f} / "
            f"{60 * ra['refused_admissions'] / ra['run_wall_s']:.1f} |")
    first = seeds[0]["runs"]
    lines += [
        "",
        f"Response lengths (tokens), seed {seeds[0]['seed']}: synchronous {lengths_text(first['sync']['response_lengths'])}; "
        f"asynchronous {lengths_text(first['async']['response_lengths'])}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
