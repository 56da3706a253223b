"""Async vs sync against the ideal overlap bound, and the engine's own ceiling, measured in one invocation.

    .venv/bin/python bench/overlap.py            # the tiny default job, about 2 min on 2 cores
    .venv/bin/python bench/overlap.py --steps 60
    .venv/bin/python bench/overlap.py --config configs/smollm2_word_problems.yaml --steps 8   # ~15 min

1. Runs a job (`--config`, the default job unless told) twice with the same seed and steps: synchronously
   (`buffer.max_staleness=0`, where generation, training and weight sync take
   turns) and asynchronously (the config's `max_staleness`, at least 1), rollout and
   learner pinned to separate cores (the configs' `cpu_affinity`). From the synchronous run, whose
   phases do not overlap, it takes T_gen (the learner's wait for a batch),
   T_train (learner compute) and T_sync (weight broadcast) per step; the ideal
   speedup of one rollout pool and one learner pool is
   (T_gen + T_train + T_sync) / max(T_gen, T_train + T_sync). The achieved
   speedup is the ratio of learner steps per second (= trained samples per
   second: the batch size is the same); efficiency = achieved / ideal.
2. Engine ceiling: vLLM alone on the same model, sampling parameters, prompt
   stream and core generates as many groups as the async run trained on. The
   engine ratio divides the rollout worker's tokens per second of loop time
   minus idle time (so weight loads, admission calls, scoring and hand-off
   count against asyncrl; waiting with nothing admitted does not) by that: the
   overhead asyncrl adds to generation. The engine alone runs twice: with as
   many requests in flight as the worker may have (max_inflight_groups x
   group_size), and with as many as the async run had on average
   (`rollout/running_mean`): where the learner is the bottleneck, admission
   follows it and the engine runs smaller batches than it could, which is
   demand, not overhead.

Medians over steps 1.. (step 0 includes the cold start). Next to the speedup,
the response-length distribution of each run's samples (p50 / p90 / p99 / max,
the fraction cut at max_new_tokens): the tail a synchronous trainer waits on.
Writes bench/results/overlap.{md,json}, or overlap_<config name>.{md,json}.
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
from results_io import lengths_text, publish  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_job(config: Path, out: Path, steps: int, staleness: int, extra: tuple[str, ...] = ()) -> tuple[list[dict], dict, dict | None]:
    """Metrics rows of steps 1.., the summary and the run's response-length distribution (`extra`: more overrides)."""
    from asyncrl.analysis.runs import load_run, response_lengths

    overrides = [f"run.output_dir={out}", f"run.steps={steps}", "run.max_train_minutes=0", f"buffer.max_staleness={staleness}", "run.eval=false",
                 "logging.wandb=false", "logging.console=false", "run.checkpoint_every=0", *extra]
    proc = subprocess.run([sys.executable, "-m", "asyncrl.run", "--config", str(config), *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({' '.join(overrides)}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    return rows, json.loads((out / "summary.json").read_text()), response_lengths(load_run(out).trajectories)


def lengths_cell(d: dict | None) -> str:
    """The run's response lengths (tokens) and how many samples they cover."""
    return f"{lengths_text(d)} ({d['samples']} samples)" if d else "–"


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def engine_alone(config: Path, n_groups: int, limits: list[int | None]) -> list[float]:
    """Tokens/s of the bare vLLM engine on the rollout worker's core, prompts and sampling parameters, for each
    limit on the requests in flight (None: as many as the worker may have, max_inflight_groups x group_size)."""
    from asyncrl.actors.engine import VLLMEngine
    from asyncrl.core.config import load_config
    from asyncrl.core.models import model_dir
    from asyncrl.core.tasks import encode_prompt, make_task
    from asyncrl.core.util import pin_to_cores

    cfg = load_config(config)
    pin_to_cores(cfg.rollout.cpu_affinity)
    import torch

    torch.set_num_threads(1)
    r = cfg.rollout
    path = str(model_dir(cfg))
    engine = VLLMEngine(path, cfg.model.dtype, cfg.model.max_model_len, cfg.run.seed, r.kv_cache_gib, r.gpu_memory_utilization)
    params = engine.sampling_params(r.temperature, r.top_p, r.max_new_tokens)
    prompts = make_task(cfg.task, cfg.run.seed, cfg.data).train_prompts(seed=cfg.run.seed * 1000)
    ids = [encode_prompt(engine.tokenizer, next(prompts).content, cfg.task.chat) for _ in range(n_groups)]
    engine.warm_up(params, ids[0])  # off the clock, as the worker's own warm-up at start (torch.compile of the sampler)
    rates = []
    for n, limit in enumerate(limits):
        limit = max(r.group_size, limit or r.max_inflight_groups * r.group_size)  # whole groups, as the worker admits
        tokens, started, running, t0 = 0, 0, 0, time.perf_counter()
        while started < n_groups or running:
            while started < n_groups and running + r.group_size <= limit:
                for i in range(r.group_size):
                    engine.add(f"l{n}-g{started}-{i}", ids[started], params)
                started, running = started + 1, running + r.group_size
            done = engine.step()
            running -= len(done)
            tokens += sum(len(f.token_ids) for f in done)
        rates.append(tokens / (time.perf_counter() - t0))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    from asyncrl.core.config import load_config

    cfg = load_config(args.config)
    staleness = max(1, cfg.buffer.max_staleness)
    with tempfile.TemporaryDirectory(prefix="overlap-") as tmp:
        sync, _, sync_lengths = run_job(args.config, Path(tmp) / "sync", args.steps, 0)
        asyn, summary, async_lengths = run_job(args.config, Path(tmp) / "async", args.steps, staleness)
    t_gen, t_train, t_sync = (median(sync, k) for k in ("time/learner_wait_s", "time/learner_compute_s", "time/weight_sync_s"))
    ideal = (t_gen + t_train + t_sync) / max(t_gen, t_train + t_sync)
    sync_step, async_step = median(sync, "time/step_s"), median(asyn, "time/step_s")
    achieved = sync_step / async_step
    groups = int(sum(r["samples/trained"] for r in asyn)) // cfg.rollout.group_size
    # the worker's requests in flight, as the async run had them on average (demand: admission follows the learner)
    running = round(median(asyn, "rollout/running_mean")) if "rollout/running_mean" in asyn[0] else None
    ceiling, at_running = engine_alone(args.config, groups, [None, running])
    # tokens per second of the worker's loop minus its idle time (nothing to run: waiting for admission is demand,
    # not capacity): it counts weight updates, admission calls, scoring and hand-off, what asyncrl adds
    workers = summary["rollout"]
    tokens = sum(w["tokens"] for w in workers)
    working_s = sum(w["loop_s"] - w["idle_s"] for w in workers)
    inside = tokens / working_s
    per_busy = tokens / sum(w["busy_s"] for w in workers)  # engine stepping alone
    update_frac = sum(w["update_s"] for w in workers) / working_s
    result = {
        "t_gen_s": t_gen, "t_train_s": t_train, "t_sync_s": t_sync, "ideal_speedup": ideal,
        "sync_step_s": sync_step, "async_step_s": async_step, "achieved_speedup": achieved, "efficiency": achieved / ideal,
        "sync_learner_wait_frac": median(sync, "time/learner_wait_frac"), "async_learner_wait_frac": median(asyn, "time/learner_wait_frac"),
        "sync_rollout_idle_frac": median(sync, "rollout/idle_frac"), "async_rollout_idle_frac": median(asyn, "rollout/idle_frac"),
        "async_weight_sync_frac": median(asyn, "time/weight_sync_frac"),
        # where a sync's time goes (async run): waiting for the previous version's loads, the learner posting buckets;
        # the slowest engine's receive+load runs on the rollout side, overlapping the next step
        **{f"sync_{part}_s": median(asyn, f"time/weight_{part}_s") for part in ("settle", "send", "load")},
        "sync_total_s": median(asyn, "time/weight_sync_s"),
        "rollout_tokens_per_s_in_asyncrl": inside, "engine_alone_tokens_per_s": ceiling, "engine_ratio": inside / ceiling,
        "async_running_mean": running, "engine_alone_at_running_tokens_per_s": at_running,
        "engine_ratio_at_running": inside / at_running,
        "rollout_tokens_per_busy_s": per_busy, "engine_ratio_per_busy_s": per_busy / ceiling, "rollout_update_frac": update_frac,
        "async_max_staleness": staleness, "sync_response_lengths": sync_lengths, "async_response_lengths": async_lengths,
    }
    lines = [
        f"Overlap and engine ceiling, {name_of(args.config)}, {args.steps} steps per mode, async at max_staleness "
        f"{staleness}, medians over steps 1.. (`bench/overlap.py {' '.join(sys.argv[1:])}`)",
        "",
        "| measure | value |", "|---|---|",
        f"| T_gen / T_train / T_sync per step (sync run) | {t_gen:.3f} / {t_train:.3f} / {t_sync:.3f} s |",
        f"| ideal speedup (T_gen+T_train+T_sync) / max(T_gen, T_train+T_sync) | {ideal:.2f}x |",
        f"| step time sync → async | {sync_step:.3f} → {async_step:.3f} s |",
        f"| achieved speedup (steps/s and samples/s) | {achieved:.2f}x |",
        f"| response lengths, sync run | {lengths_cell(sync_lengths)} |",
        f"| response lengths, async run | {lengths_cell(async_lengths)} |",
        f"| **efficiency achieved / ideal** (target ≥ 0.85) | **{achieved / ideal:.2f}** |",
        f"| learner wait, sync → async | {result['sync_learner_wait_frac']:.0%} → {result['async_learner_wait_frac']:.0%} |",
        f"| rollout idle, sync → async | {result['sync_rollout_idle_frac']:.0%} → {result['async_rollout_idle_frac']:.0%} |",
        f"| weight sync / step time (async) (target ≤ 5 %) | {result['async_weight_sync_frac']:.0%} |",
        f"| a sync on the learner's path (async run): total / settle previous / post buckets | "
        f"{result['sync_total_s'] * 1e3:.1f} / {result['sync_settle_s'] * 1e3:.1f} / {result['sync_send_s'] * 1e3:.1f} ms |",
        f"| engine receive+load per sync, overlapping the next step (async run) | {result['sync_load_s'] * 1e3:.1f} ms |",
        f"| rollout tokens/s while it has work (loop time minus idle): in asyncrl / vLLM alone | {inside:.0f} / {ceiling:.0f} |",
        f"| **engine ratio** (target ≥ 0.9) | **{inside / ceiling:.2f}** |",
        f"| vLLM alone with the requests in flight the async run had on average ({running}) | {at_running:.0f} tokens/s |",
        f"| **engine ratio at that concurrency** (in asyncrl / vLLM alone) | **{inside / at_running:.2f}** |",
        f"| share of that time spent loading weights (`update_s`) | {update_frac:.0%} |",
        f"| engine stepping alone (tokens per engine-busy second) / vLLM alone | {per_busy:.0f} / {ceiling:.0f} = {per_busy / ceiling:.2f} |",
        f"| rollout tokens per wall second in asyncrl (includes waiting for admission) | {median(asyn, 'rollout/tokens_per_s'):.0f} |",
    ]
    text = "\n".join(lines) + "\n"
    default = args.config.resolve() == (ROOT / "configs" / "default.yaml").resolve()
    publish(args.out, "overlap" if default else f"overlap_{args.config.stem}", text, result)


def name_of(config: Path) -> str:
    return "default job" if config.stem == "default" else f"`{config.name}`"


if __name__ == "__main__":
    main()
