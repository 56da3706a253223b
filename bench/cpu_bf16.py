"""bf16 compute with fp32 master weights against fp32, on this machine's CPU: should a CPU recipe use bf16?

`model.dtype=auto` picks bf16 on CPUs whose flags say they multiply bf16 in hardware (avx512_bf16 / amx_bf16)
and fp32 elsewhere; this benchmark measures what that choice is worth here, in one run: a matmul's GFLOP/s in
each dtype, and the FSDP2 learner's step (world 1, the same batch) with model.dtype float32 and bfloat16.

    .venv/bin/python bench/cpu_bf16.py [--config configs/smollm2_word_problems.yaml] [--steps 3]

Writes bench/results/cpu_bf16.{json,md}. Nothing else should run meanwhile.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def matmul_gflops(dtype, n: int = 1024, repeats: int = 5) -> float:
    import torch

    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e9


def batch(vocab: int, n: int, prompt: int, response: int) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = lambda k: torch.randint(3, vocab, (k,), generator=g).tolist()  # noqa: E731
    return [{"group_id": f"g{i // 4}", "prompt_ids": ids(prompt), "response_ids": ids(response), "behavior_logprobs": [-2.0] * response,
             "reward": float(i % 2), "policy_version_start": 0, "policy_version_end": 0, "finish_reason": "stop"} for i in range(n)]


def learner_step_s(config: Path, dtype: str, steps: int, n: int, prompt: int, response: int) -> float:
    from asyncrl.actors.learner import Learner
    from asyncrl.core.config import load_config
    from asyncrl.core.models import resolve_model_path
    from asyncrl.core.models.cache import cache_dir

    cfg = load_config(config, [f"model.dtype={dtype}", f"learner.batch_size={n}", "rollout.group_size=4", f"learner.micro_batch_size={n}",
                               "learner.torch_threads=2"])
    path = resolve_model_path(cfg.model.path, cfg.task.digits, cfg.run.seed, cache_dir(cfg.model.cache_dir))
    lrn = Learner(cfg, str(path))
    samples = batch(lrn.model.config.vocab_size, n, prompt, response)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        lrn.train_step(samples, version=step)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first step warms up


def render(result: dict) -> str:
    """The table, from the published result alone."""
    mm, st = result["matmul_gflops"], result["learner_step_s"]
    n, prompt, response = result["batch"]
    return "\n".join([
        f"bf16 compute (fp32 master) against fp32 on this CPU ({result['cpu']}; {result['date']}, commit {result['commit']}; "
        f"flags {' '.join(result['cpu_flags'])}; native bf16: {result['native_bf16']}; torch {result['torch']}, {result['torch_cpu_capability']})",
        "", "| | float32 | bfloat16 | bf16 / fp32 |", "|---|---|---|---|",
        f"| 1024² matmul, GFLOP/s | {mm['float32']:.1f} | {mm['bfloat16']:.1f} | {mm['bfloat16'] / mm['float32']:.2f}x |",
        f"| learner step ({result['config']}, {n} x ({prompt} + {response}) tokens), s | {st['float32']:.2f} | {st['bfloat16']:.2f} | {st['bfloat16'] / st['float32']:.2f}x time |",
        "", f"model.dtype=auto picks {'bfloat16' if result['native_bf16'] else 'float32'} on this CPU.", ""])


def main() -> None:
    import torch

    from asyncrl.core.util import cpu_has_native_bf16
    from results_io import provenance, publish, shown

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "smollm2_word_problems.yaml")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--response", type=int, default=64)
    args = p.parse_args()
    start = provenance(sys.argv[1:])
    torch.set_num_threads(2)
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    result = {
        "date": datetime.date.today().isoformat(), "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "cpu": platform.processor() or next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"),
        "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx"))), "native_bf16": cpu_has_native_bf16(), "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "load_1m": open("/proc/loadavg").read().split()[0],
        "matmul_gflops": {d: matmul_gflops(getattr(torch, d)) for d in ("float32", "bfloat16")},
        "config": shown(args.config), "batch": [args.batch, args.prompt, args.response],
        "learner_step_s": {d: learner_step_s(args.config, d, args.steps, args.batch, args.prompt, args.response) for d in ("float32", "bfloat16")},
    }
    mm, st = result["matmul_gflops"], result["learner_step_s"]
    if min(mm.values()) <= 0 or min(st.values()) <= 0:
        raise SystemExit(f"impossible figure: {mm} {st}")
    publish(ROOT / "bench" / "results", "cpu_bf16", "cpu_bf16", result, sys.argv[1:], start)


if __name__ == "__main__":
    main()
