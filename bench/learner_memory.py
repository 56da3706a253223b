"""The FSDP2 learner's memory and speed per rank: learner world 1 vs 2, gradient checkpointing, CPU offload.

    .venv/bin/python bench/learner_memory.py                          # SmolLM2-135M and a random Qwen2.5-0.5B-shaped model, CPU
    .venv/bin/python bench/learner_memory.py --device cuda            # the same on GPUs (world 2 needs two)
    .venv/bin/python bench/learner_memory.py --models tiny --steps 1  # the tiny random model, seconds (a smoke test)

One batch, the same for every configuration: `--batch` samples (groups of 4) of a 64-token prompt and a 64-token
response, random token ids of the model's vocabulary, micro-batches of 4, GRPO with the default config's reference
policy (`algorithm.kl_ref_every=1`: the reference's forward pass runs every step), lr 1e-6. Models: (a)
SmolLM2-135M-Instruct (`model.path=smollm2-135m-instruct`, converted once into the model cache), (b) a randomly
initialised model of Qwen2.5-0.5B's shape (494 M parameters, tied embeddings; built once into the model cache, no
download), (c) `tiny`, the project's tiny random Qwen2 (for smoke tests only).

Configurations per model: learner world 1 and 2 (one process per rank, gloo on CPUs with one torch thread each, NCCL
on GPUs with one GPU each), `learner.gradient_checkpointing` off/on, `learner.offload` off/on (GPU only: on CPUs
the config refuses it and the cell says so), and the learner before FSDP2 (commit 88d58fc, "today's learner"), run
from a temporary `git worktree` of that commit by the same timing worker, world 1, on the same batch. Every
configuration runs in fresh processes, so the peak memory is that configuration's. Per rank:

- s/step: the median of the steps after the first (`--steps`, default 3; the first is warm-up; with one step, it);
  a world-2 configuration's step is the slower rank's;
- peak GB: `asyncrl.core.memory.peak_memory_gb` (peak RSS on CPUs, CUDA's max allocated on GPUs) after the steps;
  on GPUs the peak RSS is reported too (the offloaded state lives there);
- state GB: the bytes of the tensors this rank holds for the policy's parameters, their gradients and AdamW's state
  (a DTensor's local shard), measured after the steps; the frozen reference policy's bytes are reported apart.

Targets, checked with the numbers of this one run (a MISS is printed, not raised): (1) at world 2, the state per rank
is at most 0.6 x world 1's (same model, checkpointing off); (2) world 1's step (checkpointing off) is within 1.2 x
the baseline's. An impossible figure (a world-2 state ratio below 0.5, a step of no time) exits non-zero, as does
a configuration that failed. Writes bench/results/learner_memory.{json,md} (`--out`); the markdown is generated from
the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
BASELINE_COMMIT = "88d58fc"
GROUP_SIZE = 4
PROMPT_TOKENS = 64
RESPONSE_TOKENS = 64
MICRO_BATCH = 4
LR = 1e-6
STATE_TARGET, STATE_FLOOR = 0.6, 0.5  # world 2's state per rank / world 1's: target, and what sharding cannot go below
TIME_TARGET = 1.2  # world 1's step / the baseline's
QWEN_SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6)
QWEN_SPECIAL = 151643  # <|endoftext|>: Qwen2.5's bos, eos and pad id
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct (model.path=smollm2-135m-instruct)",
    "qwen0.5b-shape": "Qwen2.5-0.5B's shape, random init (fp32)",
    "tiny": "the tiny random Qwen2 of the tests (smoke only)",
}
DEFAULT_MODELS = ("smollm2", "qwen0.5b-shape")
OFFLOAD_CPU = "n/a on CPUs: learner.offload is GPU-only (the config refuses it: a CPU learner's state is in host memory already)"


# ----------------------------------------------------------------------------- models (built once into the model cache)
def prepare_model(name: str) -> dict:
    """{path, params, vocab} of a benchmark model, building it into the model cache the first time."""
    import torch
    from transformers import AutoConfig

    from asyncrl.core.config import load_config
    from asyncrl.core.models import resolve_model_path
    from asyncrl.core.models.cache import cache_dir, cached_build

    if name == "smollm2":
        defaults = load_config(None, [])
        path = resolve_model_path("smollm2-135m-instruct", defaults.task.digits, defaults.run.seed, cache_dir(defaults.model.cache_dir))
    elif name == "qwen0.5b-shape":
        path = cached_build(cache_dir() / "qwen2.5-0.5b-shape-random-s0", build_qwen_shape)
    elif name == "tiny":
        from asyncrl.core.models.tiny import TinySpec

        path = cached_build(cache_dir() / f"tiny-random-{TinySpec().key()}", build_tiny_random)
    else:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    return {"path": str(path), "params": params, "vocab": config.vocab_size}


def build_qwen_shape(out: Path, **shape) -> None:
    """A randomly initialised Qwen2ForCausalLM of Qwen2.5-0.5B's shape, saved in fp32. No tokenizer: the learner
    reads the model, its config and `pad_token_id` only (the benchmark's token ids are random)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**{**QWEN_SHAPE, **shape}, bos_token_id=QWEN_SPECIAL, eos_token_id=QWEN_SPECIAL, pad_token_id=QWEN_SPECIAL)
    Qwen2ForCausalLM(config).to(torch.float32).save_pretrained(out)


def build_tiny_random(out: Path) -> None:
    """The untrained tiny Qwen2 of tests/conftest.py's `random_model_dir`."""
    from asyncrl.core.models.tiny import TinySpec, build_model, build_tokenizer, save_tokenizer

    tokenizer = build_tokenizer()
    build_model(TinySpec(), len(tokenizer)).save_pretrained(out)
    save_tokenizer(tokenizer, out)


# ----------------------------------------------------------------------------- the timing worker (one rank, one process)
def make_samples(batch: int, group_size: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> list[dict]:
    """tests/test_learner.py's fake_samples at this size: random ids (above the tiny model's pad/bos/eos), one prompt
    per group, rewards 0/1 alternating in a group, behaviour log-probs near a uniform policy's (-log V)."""
    rng = random.Random(seed)
    low = 3 if vocab > 3 else 0
    uniform = -math.log(vocab)
    samples = []
    for g in range(batch // group_size):
        prompt = [rng.randrange(low, vocab) for _ in range(prompt_len)]
        for i in range(group_size):
            samples.append({
                "group_id": f"g{g}", "prompt_ids": prompt, "response_ids": [rng.randrange(low, vocab) for _ in range(response_len)],
                "behavior_logprobs": [uniform + rng.uniform(-0.1, 0.1) for _ in range(response_len)], "reward": float(i % 2),
                "policy_version_start": 0, "policy_version_end": 0, "finish_reason": "stop",
            })
    return samples


def held_bytes(learner) -> dict:
    """GB this rank holds for the policy's parameters, gradients and optimizer state (a DTensor: its local shard),
    the frozen reference's parameters, and the policy's local/global element counts."""
    import torch
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    def nbytes(tensors) -> int:
        return sum(local(t).numel() * local(t).element_size() for t in tensors)

    params = list(learner.model.parameters())
    opt = getattr(learner, "opt", None)
    state = [v for s in (opt.state.values() if opt is not None else ()) for v in s.values() if torch.is_tensor(v)]
    ref = getattr(learner, "ref_model", None)
    parts = {"params": nbytes(params), "grads": nbytes(p.grad for p in params if p.grad is not None), "optimizer": nbytes(state)}
    devices = sorted({str(local(t).device.type) for t in [*params, *state]})
    return {"state_gb": sum(parts.values()) / 1e9, **{f"{k}_gb": v / 1e9 for k, v in parts.items()},
            "ref_gb": nbytes(ref.parameters()) / 1e9 if ref is not None else 0.0, "state_devices": devices,
            "local_numel": sum(local(p).numel() for p in params), "global_numel": sum(p.numel() for p in params)}


def worker(spec_path: Path, rank: int) -> None:
    """Build one Learner rank from the code at spec["root"] (this checkout or the baseline's worktree), join the group,
    time `steps` train steps on the benchmark batch, and write what it held to spec["out"]/rank<R>.json."""
    spec = json.loads(spec_path.read_text())
    # the code under test is spec["root"]'s: first on the path (the editable install's finder comes after it), and
    # bench/ (where this file is) off it
    sys.path[:] = [spec["root"]] + [p for p in sys.path if Path(p or ".").resolve() not in (BENCH, Path(spec["root"]).resolve())]
    import torch

    ray_stubbed = False
    if spec["kind"] == "baseline":  # 88d58fc's learner imports Ray at the top and uses it only to name its node
        try:
            import ray  # noqa: F401
        except ImportError:  # a machine without Ray (the GPU box): an empty module stands in; nothing here calls it
            import types

            sys.modules["ray"] = types.ModuleType("ray", "a stand-in: Ray is not installed")
            ray_stubbed = True
    import asyncrl.actors.learner as learner_module
    from asyncrl.core.config import load_config

    try:
        from asyncrl.core.memory import peak_memory_gb
    except ImportError:  # the baseline has no asyncrl.core.memory: the same figure
        def peak_memory_gb(device: torch.device) -> float:
            if device.type == "cuda":
                return torch.cuda.max_memory_allocated(device) / 1e9
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9

    cfg = load_config(None, spec["overrides"])
    learner = learner_module.Learner(cfg, spec["model_dir"], rank)
    if spec["world"] > 1:
        learner.init_learner_group("127.0.0.1", spec["port"], rank, spec["world"], "asyncrl-learners-bench")
    b = spec["batch"]
    samples = make_samples(b["batch"], b["group_size"], b["prompt_tokens"], b["response_tokens"], b["vocab"])
    device = learner.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times, metrics = [], {}
    for _ in range(spec["steps"]):
        sync()
        t0 = time.perf_counter()
        metrics = learner.train_step(samples, 0)
        sync()
        times.append(time.perf_counter() - t0)
    measured = times[1:] or times
    est = getattr(learner, "memory", None)  # the FSDP2 learner's own estimate, made before loading (asyncrl.core.memory)
    result = {
        "rank": rank, "step_s": times, "step_s_median": statistics.median(measured), "warmup_included": len(times) == 1,
        "peak_gb": peak_memory_gb(device), "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
        **held_bytes(learner),
        "estimate_gb": None if est is None else {"params": est.params, "grads": est.grads, "optimizer": est.optimizer,
                                                 "reference": est.reference, "in_flight": est.in_flight, "device": est.device, "host": est.host},
        "loss_policy": metrics.get("loss/policy"), "learner_file": learner_module.__file__,
        "ray_imported": "ray" in sys.modules, "ray_stubbed": ray_stubbed, "torch_threads": torch.get_num_threads(),
    }
    if spec["world"] > 1:
        learner.close()
    (Path(spec["out"]) / f"rank{rank}.json").write_text(json.dumps(result, indent=2))


# ----------------------------------------------------------------------------- running configurations
def run_configuration(run: dict, spec: dict, root: Path, work: Path, visible_gpus: list[str], timeout_s: float) -> dict:
    """Start one process per rank (cwd `root`), wait for all, and fill `run` with their results or the failure."""
    from asyncrl.core.weights import free_port

    out = work / run["id"]
    out.mkdir(parents=True)
    spec = {**spec, "root": str(root), "out": str(out), "kind": run["kind"], "world": run["world"], "port": free_port(), "overrides": run["overrides"]}
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    procs, logs = [], []
    t0 = time.monotonic()
    for rank in range(run["world"]):
        env = dict(os.environ)
        if spec["device"] == "cuda" and run["world"] > 1:  # one GPU per rank, each its own cuda:0
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus[rank]
        log = open(out / f"rank{rank}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path), "--rank", str(rank)],
                                      cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT))
    failed = None
    while True:
        codes = [p.poll() for p in procs]
        bad = [(rank, c) for rank, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            failed = f"rank {bad[0][0]} exited with {bad[0][1]}"
        elif all(c == 0 for c in codes):
            break
        elif time.monotonic() - t0 > timeout_s:
            failed = f"timed out after {timeout_s:.0f} s"
        if failed:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            break
        time.sleep(0.5)
    for log in logs:
        log.close()
    run["wall_s"] = time.monotonic() - t0
    if failed:
        logs_text = [(out / f"rank{r}.log").read_text().splitlines() for r in range(run["world"])]
        culprit = next((r for r, p in enumerate(procs) if p.returncode not in (0, None, -9)), 0)
        last = next((line for line in reversed(logs_text[culprit]) if line.strip()), "")
        run.update(status="failed", reason=f"{failed}: {last.strip()[:300]}",
                   log_tail="\n".join(f"--- rank {r} ---\n" + "\n".join(lines[-25:]) for r, lines in enumerate(logs_text)))
        return run
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(run["world"])]
    for r in ranks:  # the code that ran must be the checkout's it was meant to be
        if not Path(r["learner_file"]).resolve().is_relative_to(root.resolve()):
            raise RuntimeError(f"{run['id']}: rank {r['rank']} imported {r['learner_file']}, not the learner under {root}")
    run.update(status="ok", ranks=ranks, step_s=max(r["step_s_median"] for r in ranks))
    return run


def overrides(model_dir: str, args: argparse.Namespace, world: int, extra: list[str]) -> list[str]:
    device = ["learner.device=cuda", "learner.num_gpus=1"] if args.device == "cuda" else ["learner.device=cpu"]
    return [f"model.path={model_dir}", f"model.dtype={args.dtype}", f"model.max_model_len={2 * (PROMPT_TOKENS + RESPONSE_TOKENS)}",
            f"rollout.max_new_tokens={RESPONSE_TOKENS}", f"rollout.group_size={GROUP_SIZE}", f"learner.batch_size={args.batch}",
            f"learner.micro_batch_size={MICRO_BATCH}", f"learner.lr={LR}", f"learner.num_workers={world}", "learner.torch_threads=1",
            *device, *extra]


def plan(model: str, model_dir: str, args: argparse.Namespace, gpus: int) -> list[dict]:
    """Every configuration of one model: the FSDP2 learner's grid, then the baseline."""
    runs = []
    for world in (1, 2):
        for gc in (False, True):
            for offload in (False, True):
                run = {"id": f"{model}-w{world}-gc{int(gc)}-off{int(offload)}", "model": model, "kind": "fsdp2", "world": world,
                       "gradient_checkpointing": gc, "offload": offload,
                       "overrides": overrides(model_dir, args, world, [f"learner.gradient_checkpointing={str(gc).lower()}", f"learner.offload={str(offload).lower()}"])}
                if offload and args.device == "cpu":
                    run.update(status="n/a", reason=OFFLOAD_CPU)
                elif args.device == "cuda" and world > gpus:
                    run.update(status="n/a", reason=f"n/a: world {world} needs {world} GPUs (NCCL puts one rank on each); {gpus} visible")
                runs.append(run)
    if not args.no_baseline:  # the learner before FSDP2 has neither gradient checkpointing nor offload
        runs.append({"id": f"{model}-baseline", "model": model, "kind": "baseline", "world": 1, "gradient_checkpointing": False,
                     "offload": False, "overrides": overrides(model_dir, args, 1, [])})
    return runs


# ----------------------------------------------------------------------------- ratios, targets, the table
def find(runs: list[dict], model: str, kind: str = "fsdp2", world: int = 1, gc: bool = False, offload: bool = False) -> dict | None:
    for r in runs:
        if (r["model"], r["kind"], r["world"], r["gradient_checkpointing"], r["offload"]) == (model, kind, world, gc, offload) and r.get("status") == "ok":
            return r
    return None


def max_rank(run: dict, key: str) -> float:
    return max(r[key] for r in run["ranks"])


def analyse(runs: list[dict], models: list[str]) -> tuple[dict, list[dict], list[str]]:
    """Ratios measured in this run, the two targets (PASS/MISS/not measured) and the impossible figures."""
    ratios, checks, impossible = {}, [], []
    for r in runs:
        for rank in r.get("ranks", []):
            if not rank["step_s_median"] > 0:
                impossible.append(f"{r['id']} rank {rank['rank']}: step time {rank['step_s_median']} s is not positive")
    for m in models:
        w1, w2, base = find(runs, m), find(runs, m, world=2), find(runs, m, kind="baseline")
        w1gc, w2gc = find(runs, m, gc=True), find(runs, m, world=2, gc=True)
        rat = {}

        def ratio(key: str, a: dict | None, b: dict | None, field: str) -> None:
            if a and b:
                num, den = (x["step_s"] if field == "step_s" else max_rank(x, field) for x in (a, b))
                rat[key] = num / den if den > 0 else None

        ratio("state per rank, world 2 / world 1", w2, w1, "state_gb")
        ratio("peak per rank, world 2 / world 1", w2, w1, "peak_gb")
        ratio("s/step, world 2 / world 1", w2, w1, "step_s")
        ratio("s/step, world 1 / baseline", w1, base, "step_s")
        ratio("peak, world 1 / baseline", w1, base, "peak_gb")
        ratio("state, world 1 / baseline", w1, base, "state_gb")
        ratio("peak, checkpointing on / off (world 1)", w1gc, w1, "peak_gb")
        ratio("s/step, checkpointing on / off (world 1)", w1gc, w1, "step_s")
        ratio("peak, checkpointing on / off (world 2)", w2gc, w2, "peak_gb")
        for world in (1, 2):
            ratio(f"peak, offload on / off (world {world})", find(runs, m, world=world, offload=True), find(runs, m, world=world), "peak_gb")
            ratio(f"s/step, offload on / off (world {world})", find(runs, m, world=world, offload=True), find(runs, m, world=world), "step_s")
        ratios[m] = rat

        if w1 and w2 and max_rank(w1, "state_gb") > 0:
            s1, s2 = max_rank(w1, "state_gb"), max_rank(w2, "state_gb")
            q = s2 / s1
            checks.append({"model": m, "target": f"(1) world-2 state per rank <= {STATE_TARGET} x world 1's", "value": q,
                           "result": "PASS" if q <= STATE_TARGET else "MISS",
                           "text": f"{s2:.3f} GB (largest rank) / {s1:.3f} GB = {q:.3f} (target <= {STATE_TARGET})"})
            if q < STATE_FLOOR:
                impossible.append(f"{m}: world-2 state ratio {q:.3f} < {STATE_FLOOR} ({s2:.3f} / {s1:.3f} GB): two shards cannot hold less than half")
        else:
            checks.append({"model": m, "target": f"(1) world-2 state per rank <= {STATE_TARGET} x world 1's", "value": None,
                           "result": "not measured", "text": "world 1 or world 2 (checkpointing off, offload off) did not run"})
        if w1 and base and w1["step_s"] > 0 and base["step_s"] > 0:  # a time of 0 is reported as impossible above
            q = w1["step_s"] / base["step_s"]
            checks.append({"model": m, "target": f"(2) world-1 s/step <= {TIME_TARGET} x the baseline's", "value": q,
                           "result": "PASS" if q <= TIME_TARGET else "MISS",
                           "text": f"{w1['step_s']:.3f} s / {base['step_s']:.3f} s = {q:.3f} (target <= {TIME_TARGET})"})
        else:
            checks.append({"model": m, "target": f"(2) world-1 s/step <= {TIME_TARGET} x the baseline's", "value": None,
                           "result": "not measured", "text": "world 1 (checkpointing off, offload off) or the baseline did not run"})
    return ratios, checks, impossible


def markdown(data: dict) -> str:
    """The results table, from the JSON alone."""
    env, s = data["environment"], data["settings"]
    cuda = s["device"] == "cuda"
    head = (f"Learner memory and speed per rank (`{data['command']}`), {env['date']}, commit {env['commit'][:10]}"
            f"{' (uncommitted changes)' if env['dirty'] else ''}; baseline: the learner before FSDP2, commit {s['baseline_commit']}. "
            f"Device {s['device']}{' (' + env['gpu'] + ')' if cuda and env.get('gpu') else ''}, {env['nproc']} cores ({env['cpu_model']}; "
            f"flags {' '.join(env['cpu_flags']) or 'none of note'}), load {env['load_avg_start']:.2f} at start, {env['load_avg_end']:.2f} at the end; "
            f"python {env['python']}, torch {env['torch']}, transformers {env['transformers']}"
            f"{', CUDA ' + str(env['cuda']) if cuda else ''}.\n\n"
            f"Batch: {s['batch']} samples (groups of {s['group_size']}), prompt {s['prompt_tokens']} + response {s['response_tokens']} tokens, "
            f"micro-batches of {s['micro_batch_size']}, GRPO with the reference's forward pass every step, lr {s['lr']}, {s['dtype']} compute, "
            f"one torch thread per rank (world 2 uses two cores{' and two GPUs' if cuda else ''}, world 1 one); s/step: "
            f"{'the one step (it includes the warm-up)' if s['steps'] == 1 else 'the median of steps 2..' + str(s['steps']) + ' (the first is warm-up)' if s['steps'] > 2 else 'step 2 (the first is warm-up)'}"
            f", a world-2 step is the slower rank's. "
            f"Per rank (r0 / r1): peak GB ({'CUDA max allocated' if cuda else 'peak RSS'}), state GB (parameters + gradients + AdamW state "
            f"this rank holds, after the steps), ref GB (the frozen reference policy's parameters), est. GB (the learner's own estimate of "
            f"parameters + gradients + optimizer, asyncrl/core/memory.py).\n")
    cols = ["model", "learner", "world", "ckpt", "offload", "s/step", "peak GB", *(["peak RSS GB"] if cuda else []), "state GB", "ref GB", "est. GB", "note"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    def per_rank(run: dict, f) -> str:
        return " / ".join(f(r) for r in run["ranks"])

    for run in data["runs"]:
        learner = f"before FSDP2 ({s['baseline_commit']})" if run["kind"] == "baseline" else "FSDP2"
        cells = [run["model"], learner, str(run["world"]), "on" if run["gradient_checkpointing"] else "off",
                 "on" if run["offload"] else "off"]
        if run.get("status") == "ok":
            est = lambda r: "-" if r["estimate_gb"] is None else f"{r['estimate_gb']['params'] + r['estimate_gb']['grads'] + r['estimate_gb']['optimizer']:.3f}"  # noqa: E731
            cells += [f"{run['step_s']:.3f}", per_rank(run, lambda r: f"{r['peak_gb']:.3f}"),
                      *([per_rank(run, lambda r: f"{r['peak_rss_gb']:.3f}")] if cuda else []),
                      per_rank(run, lambda r: f"{r['state_gb']:.3f}"), per_rank(run, lambda r: f"{r['ref_gb']:.3f}"), per_rank(run, est),
                      "state on " + "/".join(run["ranks"][0]["state_devices"]) if run["offload"] else ""]
        else:
            cells += ["-"] * (6 if cuda else 5) + [run.get("reason", run.get("status", "")).replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    out = [head, "\n".join(lines), ""]
    for model, rat in data["ratios"].items():
        if rat:
            out.append(f"Ratios, {model}: " + "; ".join(f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in rat.items()) + ".")
    out.append("")
    out += [f"- {c['result']}: {c['model']}, {c['target']}: {c['text']}" for c in data["checks"]]
    if data["notes"].get("ray_stubbed_in"):
        out.append(f"- Ray is not installed here: the baseline's learner (which imports it at the top) ran with an empty stand-in `ray` module "
                   f"({', '.join(data['notes']['ray_stubbed_in'])}).")
    if data["errors"]:
        out += ["", "Errors:", *[f"- {e}" for e in data["errors"]]]
    return "\n".join(out) + "\n"


render = markdown  # what bench/tables.py rebuilds the table with (results_io.render_record)


# ----------------------------------------------------------------------------- the machine and the code measured
def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def environment(device: str) -> dict:
    import torch
    import transformers

    cpu_model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu_model == "unknown":
                cpu_model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    of_note = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")
    env = {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
           "date": datetime.datetime.now().isoformat(timespec="seconds"), "nproc": os.cpu_count(), "cpu_model": cpu_model,
           "cpu_flags": [f for f in of_note if f in flags], "load_avg_start": os.getloadavg()[0], "python": platform.python_version(),
           "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda}
    if device == "cuda":
        env["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env


def baseline_worktree(tmp: Path) -> Path:
    path = tmp / f"asyncrl-{BASELINE_COMMIT}"
    git("worktree", "add", "--detach", str(path), BASELINE_COMMIT)
    return path


def remove_worktree(path: Path) -> None:
    try:
        git("worktree", "remove", "--force", str(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)
        git("worktree", "prune")


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=3, help="learner steps per configuration; the first is warm-up")
    parser.add_argument("--batch", type=int, default=8, help=f"samples per step (a multiple of {2 * GROUP_SIZE})")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="model.dtype: the compute dtype")
    parser.add_argument("--no-baseline", action="store_true", help=f"skip the learner before FSDP2 ({BASELINE_COMMIT})")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per configuration")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "learner_memory", help="writes <out>.json and <out>.md")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.rank)
    sys.path.insert(0, str(ROOT))
    if args.prepare:
        print(json.dumps(prepare_model(args.prepare)))
        return
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            parser.error(f"--models: unknown {m!r}; choose from {', '.join(MODELS)}")
    if args.steps < 1 or args.batch < 1 or args.batch % (2 * GROUP_SIZE):
        parser.error(f"--steps must be >= 1 and --batch a positive multiple of {2 * GROUP_SIZE} (groups of {GROUP_SIZE}, two ranks)")
    import torch

    sys.path.insert(0, str(BENCH))
    from results_io import provenance, publish

    start = provenance(sys.argv[1:])

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and gpus == 0:
        sys.exit("--device cuda: torch sees no GPU")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible_gpus = [g.strip() for g in visible.split(",")] if visible else [str(i) for i in range(gpus)]
    env = environment(args.device)
    prepared = {}
    for m in models:  # in a child process: the parent stays small while the ranks run
        print(f"model {m}: preparing ({MODELS[m]})", flush=True)
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--prepare", m], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:  # its configurations fail; the other models still run
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            prepared[m] = {"path": "", "params": 0, "vocab": 0, "error": f"preparing the model failed: {tail}"}
            print(f"model {m}: FAILED: {prepared[m]['error']}", flush=True)
            continue
        prepared[m] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"model {m}: {prepared[m]['path']} ({prepared[m]['params'] / 1e6:.1f} M parameters, vocabulary {prepared[m]['vocab']})", flush=True)

    runs = [run for m in models for run in plan(m, prepared[m]["path"], args, gpus)]
    for run in runs:
        if "error" in prepared[run["model"]] and run.get("status") != "n/a":
            run.update(status="failed", reason=prepared[run["model"]]["error"])
    tmp = Path(tempfile.mkdtemp(prefix="learner_memory-"))
    worktree = None
    try:
        if any(r["kind"] == "baseline" for r in runs):
            worktree = baseline_worktree(tmp)
        for run in runs:
            if run.get("status") in ("n/a", "failed"):
                print(f"{run['id']}: {run['reason']}", flush=True)
                continue
            m = run["model"]
            spec = {"model_dir": prepared[m]["path"], "steps": args.steps, "device": args.device,
                    "batch": {"batch": args.batch, "group_size": GROUP_SIZE, "prompt_tokens": PROMPT_TOKENS,
                              "response_tokens": RESPONSE_TOKENS, "vocab": prepared[m]["vocab"]}}
            print(f"{run['id']}: running ({run['world']} process{'es' if run['world'] > 1 else ''})", flush=True)
            root = worktree if run["kind"] == "baseline" else ROOT
            run_configuration(run, spec, root, tmp, visible_gpus, args.timeout)
            if run["status"] == "ok":
                print(f"{run['id']}: {run['step_s']:.3f} s/step, peak " + " / ".join(f"{r['peak_gb']:.3f}" for r in run["ranks"])
                      + " GB, state " + " / ".join(f"{r['state_gb']:.3f}" for r in run["ranks"]) + f" GB ({run['wall_s']:.0f} s)", flush=True)
            else:
                print(f"{run['id']}: FAILED: {run['reason']}\n{run['log_tail']}", flush=True)
    finally:
        if worktree is not None:
            remove_worktree(worktree)
        shutil.rmtree(tmp, ignore_errors=True)

    env["load_avg_end"] = os.getloadavg()[0]
    ratios, checks, impossible = analyse(runs, models)
    failed = [f"{r['id']}: {r['reason']}" for r in runs if r.get("status") == "failed"]
    ray_in = sorted({r["id"] for r in runs for rank in r.get("ranks", []) if rank["ray_imported"] and not rank["ray_stubbed"]})
    stubbed = sorted({r["id"] for r in runs for rank in r.get("ranks", []) if rank["ray_stubbed"]})
    data = {
        "benchmark": "learner_memory", "command": " ".join(["bench/learner_memory.py", *sys.argv[1:]]), "environment": env,
        "settings": {"device": args.device, "dtype": args.dtype, "steps": args.steps, "batch": args.batch, "group_size": GROUP_SIZE,
                     "prompt_tokens": PROMPT_TOKENS, "response_tokens": RESPONSE_TOKENS, "micro_batch_size": MICRO_BATCH, "lr": LR,
                     "baseline_commit": BASELINE_COMMIT, "timeout_s": args.timeout},
        "models": {m: {**prepared[m], "description": MODELS[m]} for m in models},
        "runs": runs, "ratios": ratios, "checks": checks, "errors": [*impossible, *failed],
        "notes": {"ray_imported_by": ray_in, "ray_stubbed_in": stubbed},
    }
    publish(args.out.parent, args.out.name, "learner_memory", data, sys.argv[1:], start)
    if impossible or failed:
        sys.exit("learner_memory: " + "; ".join([*(f"impossible figure: {e}" for e in impossible), *(f"failed: {e}" for e in failed)]))


if __name__ == "__main__":
    main()
