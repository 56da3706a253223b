"""The learner's time per sample: one update per batch or several (mini-batches), on one thread or two.

    .venv/bin/python bench/learner_phases.py --config configs/smollm2_word_problems.yaml   # about 16 min on 2 cores

Why the synchronous baseline's learner (`configs/*_sync.yaml`: a batch of 4x the asynchronous recipe's, 4
mini-batch updates on it, 2 torch threads) spends more per sample than the asynchronous learner (one update per
batch, 1 thread): with mini-batches, each update after the first needs a forward pass of its mini-batch under the
weights before it (the proximal policy of the decoupled correction; the first mini-batch's comes from its own
forward), which `algorithm.correction=none` does without; and a second thread may not pay. Each of the six cases runs in its own process on the same synthetic batch (random token ids of the model's vocabulary,
`--prompt` + `--response` tokens a sample, groups of the config's group_size), the config's learner otherwise
(LoRA, micro-batches, algorithm) with `algorithm.kl_ref_every=0`, nothing pinned; `--steps` train steps, the
median of those after the first. Writes bench/results/learner_phases[_<config name>].{json,md}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results_io import provenance, publish, record_name, shown  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
# (torch threads, mini-batches, algorithm.correction or None for the config's); the batch is mini_batches x the config's.
# correction=none: the loss weighs pi / pi_behav, so no pass recomputes pi_prox before the updates (only the first
# mini-batch's comes free from its own forward with the config's decoupled correction).
CASES = [(1, 1, None), (2, 1, None), (1, 4, None), (2, 4, None), (1, 4, "none"), (2, 4, "none")]


def worker(spec: dict) -> dict:
    """Time `steps` train steps of one learner built from `spec` in this process."""
    sys.path.insert(0, str(ROOT))
    import torch

    from learner_memory import make_samples

    from asyncrl.actors.learner import Learner
    from asyncrl.core.config import load_config
    from asyncrl.core.models import model_dir

    from transformers import AutoConfig

    cfg = load_config(spec["config"], spec["overrides"])
    torch.set_num_threads(cfg.learner.torch_threads)
    path = str(model_dir(cfg))
    learner = Learner(cfg, path, 0)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    samples = make_samples(cfg.learner.batch_size, cfg.rollout.group_size, spec["prompt"], spec["response"], vocab)
    times = []
    for _ in range(spec["steps"]):
        t0 = time.perf_counter()
        learner.train_step(samples, 0)
        times.append(time.perf_counter() - t0)
    return {"step_s": times, "batch": cfg.learner.batch_size, "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "smollm2_word_problems.yaml")
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--response", type=int, default=45)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    start = provenance(sys.argv[1:])
    from asyncrl.core.config import load_config

    base = load_config(args.config).learner.batch_size
    cases = []
    for threads, minis, correction in CASES:
        overrides = [f"learner.torch_threads={threads}", f"learner.mini_batches={minis}", f"learner.batch_size={base * minis}",
                     "learner.cpu_affinity=[]", "algorithm.kl_ref_every=0"] + ([f"algorithm.correction={correction}"] if correction else [])
        spec = {"config": str(args.config), "overrides": overrides, "prompt": args.prompt, "response": args.response, "steps": args.steps}
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"learner_phases: {threads} threads, {minis} mini-batches failed:\n{proc.stderr[-3000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        measured = out["step_s"][1:] or out["step_s"]
        cases.append({"threads": threads, "mini_batches": minis, "correction": correction, "batch": out["batch"],
                      "step_s": out["step_s"], "per_sample_s": statistics.median(measured) / out["batch"]})
        print(f"learner_phases: {threads} threads, {minis} mini-batches, correction {correction or 'as configured'}: "
              f"{cases[-1]['per_sample_s']:.3f} s a sample", flush=True)
    data = {"config": shown(args.config), "prompt": args.prompt,
            "response": args.response, "steps": args.steps, "cases": cases}
    publish(args.out, record_name("learner_phases", args.config), "learner_phases", data, sys.argv[1:], start)


def render(data: dict) -> str:
    per = {(c["threads"], c["mini_batches"], c.get("correction")): c["per_sample_s"] for c in data["cases"]}
    none = any(c == "none" for _, _, c in per)  # results from before that case have two columns fewer
    lines = [
        f"The learner of `{Path(data['config']).name}`, s per sample (median of steps after the first), synthetic samples of "
        f"{data['prompt']} prompt + {data['response']} response tokens, `algorithm.kl_ref_every=0`",
        "",
        "| | 1 update per batch | 4 mini-batch updates per 4x batch | mini-batch cost |" + (" the same, `correction=none` | its cost |" if none else ""),
        "|---|---|---|---|" + ("---|---|" if none else ""),
    ]
    for t in (1, 2):
        one, four = per[(t, 1, None)], per[(t, 4, None)]
        row = f"| {t} thread{'s' if t > 1 else ''} | {one:.3f} | {four:.3f} | {four / one:.2f}x |"
        lines.append(row + (f" {per[(t, 4, 'none')]:.3f} | {per[(t, 4, 'none')] / one:.2f}x |" if none else ""))
    speedup = f"| second thread's speedup | {per[(1, 1, None)] / per[(2, 1, None)]:.2f}x | {per[(1, 4, None)] / per[(2, 4, None)]:.2f}x | |"
    lines.append(speedup + (f" {per[(1, 4, 'none')] / per[(2, 4, 'none')]:.2f}x | |" if none else ""))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
