"""Is a task right for RL on a model? Greedy accuracy, per-sample accuracy, pass@k and the response-length
distribution of the untrained model on held-out problems, measured with the real vLLM engine.

    .venv/bin/python bench/task_probe.py --config configs/smollm2_word_problems.yaml --problems 40
        # about 5 min on 2 cores: SmolLM2-135M generates ~90 tokens/s here

The chosen workload should leave RL something to do and show a long tail: pass@k clearly above greedy
accuracy (the policy can find answers it does not yet prefer), pass@k between about 0.2 and 0.8, and p90
of the response length far above p50. The prompts, chat template, sampling parameters and reward are the
config's, through the same functions the rollout worker uses. Writes bench/results/task_probe.{md,json}.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from results_io import check_plausible, provenance, publish  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def quantile(sorted_values: list[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def probe(config: str, problems: int, k: int, threads: int) -> dict:
    from vllm import SamplingParams

    from asyncrl.actors.engine import VLLMEngine
    from asyncrl.core.config import load_config
    from asyncrl.core.models import model_dir
    from asyncrl.core.chat import encode_prompt
    from asyncrl.core.rewards import make_reward
    from asyncrl.core.tasks import make_task

    cfg = load_config(ROOT / config)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    path = str(model_dir(cfg))
    r = cfg.rollout
    engine = VLLMEngine(path, cfg.model.dtype, cfg.model.max_model_len, cfg.run.seed, r.kv_cache_gib, r.gpu_memory_utilization)
    reward = make_reward(cfg.task.reward)
    prompts = make_task(cfg.task, cfg.run.seed, cfg.data).eval_prompts()[:problems]
    ids = [encode_prompt(engine.tokenizer, p.content, cfg.task.chat) for p in prompts]
    decode = lambda tokens: engine.tokenizer.decode(tokens, skip_special_tokens=True)  # noqa: E731
    greedy = engine.greedy(ids, r.max_new_tokens)
    t0 = time.perf_counter()
    params = SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_new_tokens, n=k)
    outs = engine.llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    hits = [[reward(p, c.text) for c in o.outputs] for p, o in zip(prompts, outs)]
    lengths = sorted(len(c.token_ids) for o in outs for c in o.outputs)
    cut = sum(c.finish_reason == "length" for o in outs for c in o.outputs)
    n = len(lengths)
    return {
        "config": config, "model": cfg.model.path, "task": cfg.task.name, "problems": problems, "k": k,
        "temperature": r.temperature, "max_new_tokens": r.max_new_tokens,
        "greedy_accuracy": sum(reward(p, decode(g)) for p, g in zip(prompts, greedy)) / problems,
        "sample_accuracy": sum(map(sum, hits)) / n, f"pass@{k}": sum(max(h) for h in hits) / problems,
        "len_mean": sum(lengths) / n, "len_p50": quantile(lengths, 0.5), "len_p90": quantile(lengths, 0.9),
        "len_p99": quantile(lengths, 0.99), "len_max": lengths[-1], "truncated_frac": cut / n,
        "tokens_per_s": sum(lengths) / seconds,
    }


def render(res: dict) -> str:
    """The table, from the published result alone."""
    k = res["k"]
    return "\n".join([
        f"# Task probe: {res['task']} on {res['model']} ({res['problems']} held-out problems, T={res['temperature']}, k={k})", "",
        "| greedy acc | per-sample acc | pass@k | len p50 | p90 | p99 | max | cut at limit | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {res['greedy_accuracy']:.3f} | {res['sample_accuracy']:.3f} | {res[f'pass@{k}']:.3f} | {res['len_p50']} | {res['len_p90']} | "
        f"{res['len_p99']} | {res['len_max']} | {res['truncated_frac']:.1%} | {res['tokens_per_s']:.0f} |", "",
        f"`.venv/bin/python bench/task_probe.py --config {res['config']} --problems {res['problems']} --k {k}`", "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smollm2_word_problems.yaml")
    parser.add_argument("--problems", type=int, default=40, help="held-out problems to probe (the first N of the eval set)")
    parser.add_argument("--k", type=int, default=8, help="samples per problem (pass@k)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    res = probe(args.config, args.problems, args.k, args.threads)
    for key in ("greedy_accuracy", "sample_accuracy", f"pass@{res['k']}", "truncated_frac"):
        check_plausible("task_probe", res[key], 1.0, key)
    publish(ROOT / "bench/results", "task_probe", "task_probe", res, sys.argv[1:], start)


if __name__ == "__main__":
    main()
