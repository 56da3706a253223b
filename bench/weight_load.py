"""The engine's weight load: vLLM's whole-model `reload_weights` against asyncrl's `reload_units`, on the same tensors.

    .venv/bin/python bench/weight_load.py                                               # the tiny default job
    .venv/bin/python bench/weight_load.py --config configs/smollm2_word_problems.yaml    # 135 M, about 2 min

One vLLM engine of the job's model, pinned to the rollout worker's core as in a
run. Two update sets: the tensors a sync of this job sends (with LoRA, the
merged weights of the adapted layers and their fused siblings, from
`asyncrl.core.lora.sync_modules` on the learner's own wrapping; else every
parameter) and the whole model. Each is the initial weights plus small noise
(a load that did nothing would show). Each is loaded `--repeats` times by each
method, in alternation, and timed (median); after each method's load the
engine's log-probs of one fixed sequence are taken: the two methods must agree
exactly, and differ from the initial model's. Writes
bench/results/weight_load[_<config name>].{md,json}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from results_io import provenance, publish, record_name  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def update_sets(cfg, model_path: str) -> dict[str, list]:
    """name -> [(checkpoint name, tensor)]: what a sync of `cfg` sends, and the whole model; initial + noise, in the
    job's compute dtype (`model.dtype`, resolved), which the learner sends and the engine holds."""
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.core import lora

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    dtype = getattr(torch, cfg.model.dtype)
    state = {k: (v + 1e-3 * v.std() * torch.randn_like(v)).to(dtype) if v.is_floating_point() else v for k, v in hf.state_dict().items()}
    sets = {}
    lo = cfg.learner.lora
    if lo.rank > 0:
        wrapped = lora.wrap(hf, lo.rank, lo.alpha, list(lo.target_modules), lo.top_layers)
        names = [f"{m}.weight" for m in lora.sync_modules(wrapped)]
        sets[f"a sync ({len(names)} tensors of the LoRA layers)"] = [(n, state[n]) for n in names]
    sets[f"the whole model ({len(state)} tensors)"] = list(state.items())
    return sets


def render(result: dict) -> str:
    """The table, from the published result alone."""
    rows = []
    for label, d in result["sets"].items():
        before, after = statistics.median(d["reload_weights_s"]), statistics.median(d["reload_units_s"])
        rows.append(f"| {label}, {d['bytes'] / 1e6:.0f} MB | {before * 1e3:.0f} ms | {after * 1e3:.0f} ms | "
                    f"**{before / after:.2f}x** | {d['logprob_gap_between_methods']:.1e} | {d['logprob_change_from_initial']:.1e} |")
    return "\n".join([
        f"The engine's weight load, `{Path(result['config']).name}` ({result['model']}, {result['dtype']}), one core, median of "
        f"{result['repeats']} (`bench/weight_load.py {' '.join(result['argv'])}`)",
        "",
        "| update | vLLM `reload_weights` (before) | `reload_units` (after) | speedup | log-prob gap between the two | "
        "log-prob change from the initial weights |",
        "|---|---|---|---|---|---|",
        *rows,
    ]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    import torch

    from asyncrl.actors.engine import VLLMEngine
    from asyncrl.core.config import load_config
    from asyncrl.core.models import model_dir
    from asyncrl.core.chat import encode_prompt
    from asyncrl.core.tasks import make_task
    from asyncrl.core.util import pin_to_cores

    cfg = load_config(args.config)
    pin_to_cores(cfg.rollout.cpu_affinity)
    torch.set_num_threads(1)
    path = str(model_dir(cfg))
    r = cfg.rollout
    engine = VLLMEngine(path, cfg.model.dtype, cfg.model.max_model_len, cfg.run.seed, r.kv_cache_gib, r.gpu_memory_utilization)
    prompt = encode_prompt(engine.tokenizer, next(make_task(cfg.task, cfg.run.seed, cfg.data).train_prompts(seed=0)).content, cfg.task.chat)
    probe = prompt + engine.greedy([prompt], 16)[0]
    initial = engine.sequence_logprobs(probe, 1.0)

    def load(weights: list, scoped: bool) -> float:
        t0 = time.perf_counter()
        engine.llm.collective_rpc("asyncrl_load_weights", args=(weights, scoped))
        seconds = time.perf_counter() - t0
        engine.engine.reset_prefix_cache()
        return seconds

    data = {"config": str(args.config), "model": cfg.model.path, "dtype": cfg.model.dtype, "repeats": args.repeats, "sets": {},
            "argv": sys.argv[1:]}
    for label, weights in update_sets(cfg, path).items():
        nbytes = sum(t.numel() * t.element_size() for _, t in weights)
        times: dict[bool, list[float]] = {False: [], True: []}
        logprobs = {}
        for _ in range(args.repeats + 1):  # the first round warms both up and is not counted
            for scoped in (False, True):
                times[scoped].append(load(weights, scoped))
                logprobs[scoped] = engine.sequence_logprobs(probe, 1.0)
        gap = max(abs(a - b) for a, b in zip(logprobs[False], logprobs[True]))
        moved = max(abs(a - b) for a, b in zip(logprobs[True], initial))
        data["sets"][label] = {"bytes": nbytes, "reload_weights_s": times[False][1:], "reload_units_s": times[True][1:],
                               "logprob_gap_between_methods": gap, "logprob_change_from_initial": moved}
    publish(args.out, record_name("weight_load", args.config), "weight_load", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
