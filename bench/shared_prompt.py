"""What running a group's prompt once saves the learner: `learner.share_prompt` on and off, the same batch.

    .venv/bin/python bench/shared_prompt.py --config configs/smollm2_function_calling.yaml --prompt 470 --response 55

Each case runs in its own process (bench/learner_phases.py's worker: the config's learner, LoRA, micro-batches,
algorithm and reference pass as configured, nothing pinned) on the same synthetic batch: random token ids, one
`--prompt`-token prompt per group of the config's group_size, `--response` tokens a sample (the function-calling
recipe's prompt, its tools listing and worked example, is about 470 tokens; its answers about 55). `--steps` train
steps a case, the median of those after the first; the cases alternate `--repeats` times (on, off, on, off ...).
The bound is the ratio of token positions the passes compute (`asyncrl.core.batching.positions`): a measured speedup
above it (by more than 5 %) is impossible and fails the benchmark. Writes bench/results/shared_prompt_<config>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from results_io import check_plausible, provenance, publish, shown  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]


def position_bound(batch: int, group_size: int, micro: int, prompt: int, response: int) -> float:
    """Token positions of the learner's passes without sharing over those with it, for the synthetic batch (every
    sample prompt + response tokens, one prompt per group): the most sharing can save."""
    sys.path.insert(0, str(ROOT))
    import torch

    from asyncrl.core.batching import group_micro_batches, length_sorted_micro_batches, positions

    rows = torch.arange(batch)
    lengths = torch.full((batch,), prompt + response)
    groups = rows // group_size
    starts = torch.full((batch,), prompt - 1)  # the last prompt token's logit predicts the first answer token
    plain = positions(length_sorted_micro_batches(rows, lengths, micro), lengths, starts, None)
    shared = positions(group_micro_batches(rows, lengths, groups, micro), lengths, starts, groups)
    return plain / shared


def render(data: dict) -> str:
    on, off = data["median_s"]["on"], data["median_s"]["off"]
    return "\n".join([
        f"The learner of `{Path(data['config']).name}` on a synthetic batch of {data['batch']} samples ({data['group_size']} a group), "
        f"{data['prompt']} prompt + {data['response']} answer tokens each, micro-batches of {data['micro_batch']}; s per train step, "
        f"median of the {data['steps'] - 1 if data['steps'] > 2 else ''} step{'s' if data['steps'] > 2 else ''} after the first in each of {data['repeats']} alternating runs a case:".replace("the  step", "the step"),
        "",
        "| `learner.share_prompt` | s per step (median) | runs | speedup | bound (positions computed, off / on) |",
        "|---|---|---|---|---|",
        f"| off | {off:.1f} | {', '.join(f'{x:.1f}' for x in data['runs_s']['off'])} | | |",
        f"| on | {on:.1f} | {', '.join(f'{x:.1f}' for x in data['runs_s']['on'])} | **{off / on:.2f}x** | {data['bound']:.2f}x |",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "smollm2_function_calling.yaml")
    parser.add_argument("--prompt", type=int, default=470)
    parser.add_argument("--response", type=int, default=55)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    sys.path.insert(0, str(ROOT))  # the config's agent module loads from the repository
    from asyncrl.core.config import load_config

    cfg = load_config(args.config)
    runs: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(args.repeats):
        for case in ("on", "off"):
            spec = {"config": str(args.config), "prompt": args.prompt, "response": args.response, "steps": args.steps,
                    "overrides": [f"learner.share_prompt={'true' if case == 'on' else 'false'}", "learner.cpu_affinity=[]"]}
            proc = subprocess.run([sys.executable, str(ROOT / "bench" / "learner_phases.py"), "--worker", json.dumps(spec)], cwd=ROOT,
                                  capture_output=True, text=True, timeout=3600)
            if proc.returncode != 0:
                raise SystemExit(f"shared_prompt: share_prompt {case} failed:\n{proc.stderr[-3000:]}")
            step_s = json.loads(proc.stdout.strip().splitlines()[-1])["step_s"]
            runs[case].append(statistics.median(step_s[1:] or step_s))
            print(f"shared_prompt: share_prompt {case}: {runs[case][-1]:.1f} s a step", flush=True)
    median = {case: statistics.median(times) for case, times in runs.items()}
    bound = position_bound(cfg.learner.batch_size, cfg.rollout.group_size, cfg.learner.micro_batch_size, args.prompt, args.response)
    check_plausible("shared_prompt speedup", median["off"] / median["on"], bound * 1.05, "the ratio of positions computed")
    data = {"config": shown(args.config), "prompt": args.prompt,
            "response": args.response, "steps": args.steps, "repeats": args.repeats, "batch": cfg.learner.batch_size,
            "group_size": cfg.rollout.group_size, "micro_batch": cfg.learner.micro_batch_size, "runs_s": runs, "median_s": median,
            "bound": bound}
    publish(args.out, f"shared_prompt_{args.config.stem}", "shared_prompt", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
