"""A tiny, warm-started Hugging Face causal LM for the addition task, built and cached on disk.

Why this exists: RL post-training only helps a policy that already puts some probability
on correct answers. Downloading a real LLM is not possible on a CPU-only, offline box, so
we build a ~0.65M-parameter Qwen2 model with a character-level tokenizer and warm-start it
with supervised fine-tuning: first on exact sums, then on a *mixture* (the true sum with
probability `p_correct`, otherwise the carry-free sum). The result "knows" addition but has
not committed to it on problems with carries: the state in which GRPO-style sharpening pays.
The saved directory is a normal HF model dir, so vLLM and `AutoModelForCausalLM` load it,
and `resolve_model_path` treats it like any other local model (e.g. Qwen2.5-0.5B on a GPU).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from asyncrl.core.config import TINY_HELD_OUT
from asyncrl.core.models.cache import cache_dir, cached_build
from asyncrl.core.prompts import Prompt
from asyncrl.core.rewards import exact_match
from asyncrl.core.tasks import AdditionTask, carry_free_sum

BUILD_VERSION = 1  # bump when the recipe changes so cached models are rebuilt
PAD, BOS, EOS = "<pad>", "<s>", "</s>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
CHARS = "0123456789+= "


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines the built model (its hash names the cache dir)."""

    digits: int = 2
    seed: int = 0
    p_correct: float = 0.35
    exact_frac: float = 0.6
    sft_steps: int = 1000
    batch_size: int = 128
    lr: float = 2e-3
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 2
    intermediate_size: int = 384
    eval_size: int = TINY_HELD_OUT
    samples_per_prompt: int = 8

    @property
    def exact_steps(self) -> int:
        """SFT steps of the curriculum's first phase (exact sums only)."""
        return int(self.exact_frac * self.sft_steps)

    def key(self) -> str:
        blob = json.dumps({**asdict(self), "version": BUILD_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:8]

    def dirname(self) -> str:
        """Its directory name in the model cache: it names what was built."""
        return f"tiny-addition-d{self.digits}-s{self.seed}-{self.key()}"


def cached_tiny(cache: Path | str, spec: TinySpec) -> Path:
    """The tiny model of `spec` in the model cache `cache`, built on first use."""
    return cached_build(Path(cache) / spec.dirname(), lambda out: build_tiny_model(out, spec))


# ----------------------------------------------------------------------------- tokenizer
def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer; BOS is prepended, decode joins characters without spaces.

    It is a BPE with no merges behind a ByteLevel pre-tokenizer (space is stored as "Ġ"):
    transformers 5 loads any qwen2 checkpoint with Qwen2Tokenizer, which rebuilds exactly
    this pipeline, so every loader (ours, AutoTokenizer, vLLM) tokenizes identically.
    """
    chars = [c if c != " " else "Ġ" for c in CHARS]
    vocab = {t: i for i, t in enumerate([PAD, BOS, EOS, *chars])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(  # unk=pad stops Qwen2Tokenizer adding an out-of-vocab unk
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=PAD,
        model_max_length=64,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """save_pretrained, naming a class that transformers 4.x (e.g. on a GPU box) also knows."""
    tokenizer.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


# ----------------------------------------------------------------------------- model
def build_model(spec: TinySpec, vocab_size: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=8 * math.ceil(vocab_size / 8),
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_heads,  # head_dim = 64 (vLLM CPU rejects 16)
        num_key_value_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID
    )
    return model


# ----------------------------------------------------------------------------- SFT data
def sft_examples(spec: TinySpec, task: AdditionTask) -> Iterator[tuple[str, str]]:
    """(prompt, answer) pairs from the train stream (never the eval set).

    Curriculum: the first `exact_frac` of the steps teach exact sums (a strong carry signal,
    so the carry circuit forms reliably); the rest use the mixture, where the answer is the
    true sum with probability p_correct and the carry-free sum otherwise.
    """
    coin = random.Random(spec.seed + 1)
    n_exact = spec.exact_steps * spec.batch_size
    for i, (a, b) in enumerate(task.train_pairs(spec.seed)):
        right = i < n_exact or coin.random() < spec.p_correct
        yield f"{a}+{b}=", str(a + b if right else carry_free_sum(a, b))


def sft_batch(
    tokenizer: PreTrainedTokenizerFast, examples: Sequence[tuple[str, str]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (loss on answer + EOS only)."""
    prompts = tokenizer([p for p, _ in examples]).input_ids
    answers = tokenizer([a for _, a in examples], add_special_tokens=False).input_ids
    rows = [p + a + [tokenizer.eos_token_id] for p, a in zip(prompts, answers)]
    labels = [[-100] * len(p) + a + [tokenizer.eos_token_id] for p, a in zip(prompts, answers)]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])  # [B, T]
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])  # [B, T]
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # [B, T]
    return ids, mask, lab


def lr_factor(step: int, spec: TinySpec) -> float:
    """Linear warmup, constant through the exact phase, cosine decay over the mixture phase."""
    n_exact = spec.exact_steps
    warm = min(1.0, (step + 1) / max(1, spec.sft_steps // 20))
    if step < n_exact:
        return warm
    return warm * 0.5 * (1 + math.cos(math.pi * (step - n_exact) / (spec.sft_steps - n_exact)))


def warm_start(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, spec: TinySpec,
               task: AdditionTask) -> float:
    """AdamW (beta2=0.98, grad clip 1) on answer tokens; returns the last-step loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, spec))
    stream, loss = sft_examples(spec, task), torch.tensor(float("nan"))
    model.train()
    for _ in range(spec.sft_steps):
        ids, mask, labels = sft_batch(tokenizer, [next(stream) for _ in range(spec.batch_size)])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    return float(loss.detach())


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def generate(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, texts: Sequence[str],
             max_new_tokens: int = 8, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> list[str]:
    """Decode responses (cut at EOS). Prompts are grouped by token length, so no padding."""
    encoded = tokenizer(list(texts)).input_ids
    out: list[str] = [""] * len(texts)
    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_len.setdefault(len(ids), []).append(i)
    for idx in by_len.values():
        ids = torch.tensor([encoded[i] for i in idx])  # [B, T]
        eos = tokenizer.eos_token_id
        new = _decode_loop(model, ids, eos, max_new_tokens, temperature, generator)
        for i, row in zip(idx, new):
            out[i] = tokenizer.decode(row, skip_special_tokens=True)
    return out


def _decode_loop(model: torch.nn.Module, ids: torch.Tensor, eos: int, max_new: int,
                 temperature: float, generator: torch.Generator | None) -> list[list[int]]:
    """Plain no-cache loop (sequences are ~15 tokens); returns new tokens before EOS."""
    start, done = ids.shape[1], torch.zeros(ids.shape[0], dtype=torch.bool)  # done: [B]
    for _ in range(max_new):
        logits = model(input_ids=ids).logits[:, -1].float()  # [B, V]
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # [B]
        else:
            nxt = logits.argmax(-1)  # [B]
        nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
        ids, done = torch.cat([ids, nxt[:, None]], dim=1), done | (nxt == eos)
        if bool(done.all()):
            break
    return [_until_eos(row, eos) for row in ids[:, start:].tolist()]


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def greedy_accuracy(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast,
                    prompts: Sequence[Prompt]) -> float:
    """Fraction of prompts whose greedy response is exactly the answer."""
    responses = generate(model, tokenizer, [p.text for p in prompts])
    return sum(exact_match(p, r) for p, r in zip(prompts, responses)) / len(prompts)


def sample_accuracy(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast,
                    prompts: Sequence[Prompt], k: int, seed: int) -> tuple[float, float]:
    """(mean per-sample accuracy, pass@k) with k samples per prompt at temperature 1."""
    gen = torch.Generator().manual_seed(seed)
    texts = [p.text for p in prompts for _ in range(k)]
    responses = generate(model, tokenizer, texts, temperature=1.0, generator=gen)
    hits = [exact_match(prompts[i // k], r) for i, r in enumerate(responses)]
    per_prompt = [max(hits[i * k : (i + 1) * k]) for i in range(len(prompts))]
    return sum(hits) / len(hits), sum(per_prompt) / len(prompts)


# ----------------------------------------------------------------------------- build + cache
def build_tiny_model(out_dir: Path, spec: TinySpec) -> dict:
    """Build tokenizer + model, warm-start, measure, and save to `out_dir` atomically.

    Runs single-threaded: results then do not depend on the thread count (same seed, same
    weights), and 2 OpenMP threads on a busy 2-core box can be ~100x slower per step.
    """
    t0, threads = time.time(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        task = AdditionTask(spec.digits, spec.eval_size, spec.seed)
        tokenizer = build_tokenizer()
        model = build_model(spec, len(tokenizer))
        final_loss = warm_start(model, tokenizer, spec, task)
        metrics = _measure(model, tokenizer, task, spec)
    finally:
        torch.set_num_threads(threads)
    metrics.update(final_sft_loss=round(final_loss, 4), seconds=round(time.time() - t0, 1))
    _save_atomic(Path(out_dir), model, tokenizer, {"spec": asdict(spec), "metrics": metrics})
    return metrics


def _measure(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, task: AdditionTask,
             spec: TinySpec) -> dict:
    prompts = task.eval_prompts()
    mean_t1, pass_k = sample_accuracy(model, tokenizer, prompts, spec.samples_per_prompt, spec.seed)
    return {
        "greedy_accuracy": greedy_accuracy(model, tokenizer, prompts),
        "t1_accuracy": round(mean_t1, 4),
        f"pass@{spec.samples_per_prompt}": pass_k,
        "num_params": sum(p.numel() for p in model.parameters()),
    }


def _save_atomic(out_dir: Path, model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast,
                 info: dict) -> None:
    """Write into a sibling temp dir, then rename it into place (never half-written)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700
    try:
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)
        (tmp / "warmstart.json").write_text(json.dumps(info, indent=2) + "\n")
        if out_dir.exists():  # explicit rebuild: swap the old dir out, then delete it
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "dir")
            shutil.rmtree(old)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="build into DIR (default: the model cache, ~/.cache/asyncrl/models)")
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out is not None:
        metrics = build_tiny_model(args.out, TinySpec(digits=args.digits, seed=args.seed))
    else:
        out = cached_tiny(cache_dir(), TinySpec(digits=args.digits, seed=args.seed))
        metrics = {"path": str(out), **json.loads((out / "warmstart.json").read_text())["metrics"]}
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
