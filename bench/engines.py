"""vLLM against SGLang on the same requests, on this machine: generation throughput and the reload of a weight version.

    .venv/bin/python bench/engines.py                                               # the tiny default job
    .venv/bin/python bench/engines.py --config configs/smollm2_word_problems.yaml    # 135 M, a few minutes

Each engine runs in a process of its own with the environment a rollout actor of it gets (SGLang: the
PYTHONPATH of `actors.engines.engine_runtime_env`), one after the other, pinned to the rollout worker's cores
as in a run. Both are driven through the same facade the rollout worker uses (`add` / `step`):

- generation: the same `--prompts` prompts of the job's task, `rollout.group_size` samples each, the job's
  sampling (temperature, top_p, max_new_tokens), all submitted at once, after a warm-up; tokens generated per
  second of wall time (they stop on EOS at their own lengths, so tokens are counted, not requests), median of
  `--repeats` rounds;
- reload: this process is rank 0 of the real weight group (`asyncrl.core.weights.init_group`, the bucket plan
  of `learner.sync_bucket_mb`, `WeightSender` as the learner uses it) and publishes `--versions` versions of the
  whole model (the initial weights plus fresh noise each time); the engine's `receive_weights` is timed from
  the call to its return (receive + load + the engine's own bookkeeping: vLLM's prefix-cache reset, SGLang's
  pause / session / flush / continue). After the last version the engine's log-probs of a fixed sequence are
  compared with this process's (Hugging Face, the same weights) and with its own before the first version: the
  load is checked, not assumed (the gap must be far below the change).
- threads: neither engine is restricted beyond the job's `rollout.cpu_affinity` (none in the shipped configs);
  SGLang's forward passes run in its scheduler process, vLLM's in the engine's own.

Writes bench/results/engines[_<config name>].{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_io import provenance, publish, record_name  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENGINES = ("vllm", "sglang")


def child(args) -> None:
    """One engine: generation rounds, then `--versions` weight versions received from the parent (rank 0)."""
    import torch

    from asyncrl.actors.engines import make_engine
    from asyncrl.core.config import load_config
    from asyncrl.core.models import model_dir
    from asyncrl.core.chat import encode_prompt
    from asyncrl.core.tasks import make_task
    from asyncrl.core.util import pin_to_cores

    cfg = load_config(args.config)
    pin_to_cores(cfg.rollout.cpu_affinity)
    torch.set_num_threads(1)
    r = cfg.rollout
    t0 = time.perf_counter()
    engine = make_engine(args.engine, str(model_dir(cfg)), cfg.model.dtype, cfg.model.max_model_len, cfg.run.seed,
                         r.kv_cache_gib, r.gpu_memory_utilization)
    start_s = time.perf_counter() - t0
    params = engine.sampling_params(r.temperature, r.top_p, r.max_new_tokens)
    stream = make_task(cfg.task, cfg.run.seed, cfg.data).train_prompts(seed=0)
    prompts = [encode_prompt(engine.tokenizer, next(stream).content, cfg.task.chat) for _ in range(args.prompts)]
    engine.warm_up(params, prompts[0], n=r.group_size)
    rounds = []
    for k in range(args.repeats):
        t0, tokens = time.perf_counter(), 0
        for i, p in enumerate(prompts):
            for j in range(r.group_size):
                engine.add(f"b{k}-{i}-{j}", p, params)
        while engine.has_unfinished():
            tokens += sum(len(f.token_ids) for f in engine.step())
        rounds.append({"seconds": time.perf_counter() - t0, "tokens": tokens})

    meta = json.loads(sys.stdin.readline())  # the parent's weight group: host, port, meta, bucket bytes
    initial = engine.sequence_logprobs(meta["probe"], 1.0)
    ok = engine.init_weight_sync(meta["host"], meta["port"], 1, 2, ["broadcast", "gloo"], meta["meta"], meta["bucket_bytes"], "asyncrl-weights-bench")
    assert all(ok), ok
    reloads = []
    for _ in range(args.versions):
        print(json.dumps({"ready": True}), flush=True)
        t0 = time.perf_counter()
        engine.receive_weights(None)
        reloads.append(time.perf_counter() - t0)
    logprobs = engine.sequence_logprobs(meta["probe"], 1.0)
    print(json.dumps({"result": {"start_s": start_s, "rounds": rounds, "reload_s": reloads, "logprobs": logprobs,
                                  "initial_logprobs": initial}}), flush=True)
    engine.shutdown()


def probe_ids(cfg, model_path: str) -> list[int]:
    """A fixed sequence to score: the task's first prompt and its first eval answer's text, as the engine sees it."""
    from transformers import AutoTokenizer

    from asyncrl.core.chat import encode_prompt
    from asyncrl.core.tasks import make_task

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompt = next(make_task(cfg.task, cfg.run.seed, cfg.data).train_prompts(seed=1))
    ids = encode_prompt(tokenizer, prompt.content, cfg.task.chat) + tokenizer("42").input_ids
    return ids[: cfg.model.max_model_len]


def run_engine(engine: str, args, cfg, model_path: str) -> dict:
    """Start the engine's process, publish `--versions` versions to it, return its measurements (and the gap of
    its final log-probs to this process's)."""
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.actors.engines import engine_runtime_env
    from asyncrl.core.weights import WeightSender, flatten_into_buckets, free_port, init_group, plan_buckets, tensor_meta

    env = dict(os.environ)
    for k, v in engine_runtime_env(engine, on_gpu=False).get("env_vars", {}).items():
        env[k] = v
    cmd = [sys.executable, __file__, "--child", "--engine", engine, "--config", str(args.config),
           "--prompts", str(args.prompts), "--repeats", str(args.repeats), "--versions", str(args.versions)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    params = [p for _, p in model.named_parameters()]
    meta = tensor_meta(model.named_parameters())
    buckets = plan_buckets(meta, int(cfg.learner.sync_bucket_mb * 2**20))
    buffers = flatten_into_buckets(params, buckets)
    probe = probe_ids(cfg, model_path)
    port = free_port()
    proc.stdin.write(json.dumps({"host": "127.0.0.1", "port": port, "meta": [[m.name, m.dtype, list(m.shape)] for m in meta],
                                 "bucket_bytes": int(cfg.learner.sync_bucket_mb * 2**20), "probe": probe}) + "\n")
    proc.stdin.flush()
    sender = WeightSender(init_group("127.0.0.1", port, 0, 2, "gloo", "asyncrl-weights-bench"), buffers)
    torch.manual_seed(0)
    result = None
    for line in proc.stdout:
        msg = json.loads(line) if line.startswith("{") else {}
        if msg.get("ready"):
            sender.wait()
            with torch.no_grad():
                for p in params:
                    p.add_(1e-3 * p.std() * torch.randn_like(p))
            sender.publish()
        elif "result" in msg:
            result = msg["result"]
    if proc.wait() != 0 or result is None:
        raise RuntimeError(f"bench/engines.py: the {engine} process failed (exit {proc.returncode})")
    with torch.no_grad():
        ids = torch.tensor([probe])
        mine = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()
    final = result.pop("logprobs")
    result["logprob_gap"] = max(abs(a - b) for a, b in zip(final, mine))
    result["logprob_change"] = max(abs(a - b) for a, b in zip(final, result.pop("initial_logprobs")))
    result["bytes"] = sum(m.nbytes for m in meta)
    return result


def render(result: dict) -> str:
    """The table, from the published result alone."""
    results = {e: result[e] for e in result["engines"]}
    rows = [f"| {e} | {res['start_s']:.0f} s | {res['tokens_per_s']:.0f} | {statistics.mean(r['tokens'] for r in res['rounds']):.0f} | "
            f"{res['reload_median_s'] * 1e3:.0f} ms | {res['logprob_gap']:.1e} | {res['logprob_change']:.1e} |" for e, res in results.items()]
    ratio = ""
    if len(results) == 2:
        v, s = results["vllm"], results["sglang"]
        ratio = (f"\nSGLang / vLLM in this run: generation **{s['tokens_per_s'] / v['tokens_per_s']:.2f}x** the tokens per second, "
                 f"reload **{s['reload_median_s'] / v['reload_median_s']:.2f}x** the time per version.\n")
    versions = result["versions"]
    return "\n".join([
        f"vLLM and SGLang on the same requests, `{Path(result['config']).name}` ({result['model']}, {result['dtype']}, "
        f"{result['prompts']} prompts x {result['group_size']} samples, temperature {result['temperature']}, max_new_tokens {result['max_new_tokens']}; "
        f"reload of the whole model, {results[next(iter(results))]['bytes'] / 1e6:.1f} MB, over gloo, median of the last "
        f"{versions - 1} of {versions} versions) (`bench/engines.py {' '.join(result['argv'])}`)",
        "",
        "| engine | start-up | tokens / s (median of rounds) | tokens per round | reload per version | log-prob gap to this process's weights after the last | log-prob change from the initial weights |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]) + "\n" + ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    start = provenance(sys.argv[1:])

    import torch

    from asyncrl.core.config import load_config
    from asyncrl.core.models import model_dir

    torch.set_num_threads(1)
    cfg = load_config(args.config)
    path = str(model_dir(cfg))
    results = {e: run_engine(e, args, cfg, path) for e in args.engines}
    for res in results.values():
        res["tokens_per_s"] = statistics.median(r["tokens"] / r["seconds"] for r in res["rounds"])
        res["reload_median_s"] = statistics.median(res["reload_s"][1:] or res["reload_s"])
    r = cfg.rollout
    data = {"config": str(args.config), **results, "engines": list(results), "model": cfg.model.path, "dtype": cfg.model.dtype,
            "prompts": args.prompts, "group_size": r.group_size, "temperature": r.temperature, "max_new_tokens": r.max_new_tokens,
            "versions": args.versions, "argv": sys.argv[1:]}
    publish(args.out, record_name("engines", args.config), "engines", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
