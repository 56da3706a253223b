"""Multi-turn episodes with a slow tool: asyncrl asynchronous against synchronous, measured in one invocation.

    .venv/bin/python bench/agentic.py               # the tiny model, scripted episodes, a 50-200 ms tool (~3 min)
    .venv/bin/python bench/agentic.py --config configs/smollm2_calculator.yaml --env tests.envs_fixture.SlowCalculatorEnv --steps 8

Runs one job twice with the same seed and steps: synchronously (`buffer.max_staleness=0`: generation, tool
calls, training and weight sync take turns) and asynchronously (the config's `max_staleness`, at least 1). Every
episode's tool call takes 50-200 ms in a tool process (`--env`: by default `tests.envs_fixture.SlowToolEnv`, whose
episodes are a model turn with a tool call, a reply, and a last turn, whatever the model writes). The speedup is
the ratio of trained episodes per second (median step time over steps 1..: the batch is the same). Printed beside
it, from each run's trajectory store: the distribution of episode lengths (response tokens, observations
included), of model turns per episode and of tool calls per episode, and the tool time per call.
Writes bench/results/agentic.{md,json}, or agentic_<config name>.{md,json}.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

from overlap import median, run_job  # bench/ is on sys.path when a benchmark runs as a script
from results_io import check_plausible, lengths_text, provenance, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def episode_shape(out: Path) -> dict:
    """Lengths, model turns and tool calls per episode that ended (from the run's trajectory store; the lengths
    cover every generated sample)."""
    from asyncrl.analysis.runs import load_run, response_lengths

    table = load_run(out).trajectories
    rows = [r for r in table.select(["turns", "status"]).to_pylist() if r["turns"] and r["status"] != "aborted_at_end"]
    turns = Counter(sum(t["role"] == "model" for t in r["turns"]) for r in rows)
    calls = Counter(sum(t["role"] == "model" and t["tool"] is not None for t in r["turns"]) for r in rows)
    return {"episodes": len(rows), "lengths": response_lengths(table), "turns": dict(sorted(turns.items())),
            "calls_per_episode": dict(sorted(calls.items()))}


def counts_text(counts: dict) -> str:
    total = sum(counts.values())
    return ", ".join(f"{k}: {v / total:.0%}" for k, v in counts.items())


def render(result: dict) -> str:
    """The table, from the published result alone."""
    batch = result["batch_size"]
    sync = {k[len("sync_"):]: v for k, v in result.items() if k.startswith("sync_")}
    asyn = {k[len("async_"):]: v for k, v in result.items() if k.startswith("async_")}
    lines = [
        f"Multi-turn episodes with a 50-200 ms tool, {Path(result['config']).name} + `{result['env']}`, {result['tool_workers']} tool processes, "
        f"{result['steps']} steps per mode, "
        f"async at max_staleness {result['async_max_staleness']}, medians over steps 1.. (`bench/agentic.py {' '.join(result['argv'])}`)",
        "", "| measure | sync (max_staleness=0) | async |", "|---|---|---|",
        f"| step time | {sync['step_s']:.2f} s | {asyn['step_s']:.2f} s |",
        f"| trained episodes per second | {batch / sync['step_s']:.2f} | {batch / asyn['step_s']:.2f} |",
        f"| **speedup** (target ≥ 1.5x) | | **{result['speedup']:.2f}x** |",
        f"| learner waiting for episodes | {sync['learner_wait_frac']:.0%} | {asyn['learner_wait_frac']:.0%} |",
        f"| rollout idle | {sync['rollout_idle_frac']:.0%} | {asyn['rollout_idle_frac']:.0%} |",
        f"| episode length (response tokens) | {lengths_text(sync['lengths'])} | {lengths_text(asyn['lengths'])} |",
        f"| model turns per episode | {counts_text(sync['turns'])} | {counts_text(asyn['turns'])} |",
        f"| tool calls per episode | {counts_text(sync['calls_per_episode'])} | {counts_text(asyn['calls_per_episode'])} |",
        f"| tool calls, mean time, errors | {sync['tool_calls']}, {sync['tool_s_mean'] * 1e3:.0f} ms, {sync['tool_errors']} | "
        f"{asyn['tool_calls']}, {asyn['tool_s_mean'] * 1e3:.0f} ms, {asyn['tool_errors']} |",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "smoke.yaml")
    parser.add_argument("--env", default="tests.envs_fixture.SlowToolEnv")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tool-workers", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    from asyncrl.core.config import load_config

    smoke = args.config.resolve() == (ROOT / "configs" / "smoke.yaml").resolve()
    # enough tool processes for the episodes in flight (a tool that sleeps needs no core): with the default 2 the
    # pool, not the engine or the learner, bounds both modes (measured: 1.21x, tool-bound)
    extra = (f"env.name={args.env}", f"env.tool_workers={args.tool_workers}",
             *(("env.max_episode_tokens=40", "rollout.max_new_tokens=8") if smoke else ()))
    cfg = load_config(args.config, list(extra))
    staleness = max(1, cfg.buffer.max_staleness)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="agentic-") as tmp:
        for mode, s in (("sync", 0), ("async", staleness)):
            rows, summary, _ = run_job(args.config, Path(tmp) / mode, args.steps, s, extra)
            workers = summary["rollout"]
            calls = sum(w["tool_calls"] for w in workers)
            runs[mode] = {"step_s": median(rows, "time/step_s"), "learner_wait_frac": median(rows, "time/learner_wait_frac"),
                          "rollout_idle_frac": median(rows, "rollout/idle_frac"), "tool_calls": calls,
                          "tool_s_mean": sum(w["tool_s"] for w in workers) / max(calls, 1),
                          "tool_errors": sum(w["tool_errors"] for w in workers), **episode_shape(Path(tmp) / mode)}
    batch = cfg.learner.batch_size
    sync, asyn = runs["sync"], runs["async"]
    speedup = sync["step_s"] / asyn["step_s"]
    for mode in runs:
        check_plausible("agentic", runs[mode]["learner_wait_frac"], 1.0, f"{mode} learner waiting fraction")
        check_plausible("agentic", runs[mode]["rollout_idle_frac"], 1.0, f"{mode} rollout idle fraction")
    result = {"config": str(args.config), "env": args.env, "steps": args.steps, "async_max_staleness": staleness,
              "batch_size": batch, "speedup": speedup, "tool_workers": args.tool_workers, "argv": sys.argv[1:],
              **{f"{m}_{k}": v for m, r in runs.items() for k, v in r.items()}}
    publish(args.out, "agentic" if smoke else f"agentic_{args.config.stem}", "agentic", result, sys.argv[1:], start)


if __name__ == "__main__":
    main()
