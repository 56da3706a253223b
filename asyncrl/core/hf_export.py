"""The policy as a Hugging Face model directory: one writer for the final model, each checkpoint's hf/ and
`python -m asyncrl.export`.

The learner gathers its sharded state into an ordinary state dict (or export reads it from a checkpoint's shards);
from there the path is the same: a model of the run's architecture built on the meta device holds the tensors, in
model.dtype, and is written with `save_pretrained` (config.json, model.safetensors, generation_config.json), then
the tokenizer. With LoRA the adapter is merged into the written model, and the adapter alone goes to adapter/ as a
peft directory.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

ADAPTER_DIR = "adapter"
"""The LoRA adapter alone (a peft directory) inside an exported model directory."""


def plain_model(model_path: str, state: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.nn.Module:
    """A Hugging Face model of `model_path`'s architecture holding `state` (built on the meta device: no second
    initialisation of the weights), with `model_path`'s generation config when it has one."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    if os.path.isfile(f"{model_path}/generation_config.json"):
        model.generation_config = GenerationConfig.from_pretrained(model_path)
    return model.to(dtype)


def write_hf_model(path: str | Path, model_path: str, plain: dict[str, torch.Tensor], dtype: torch.dtype, tokenizer_from: str) -> Path:
    """`plain` (an ordinary state dict of `model_path`'s architecture) as a model directory at `path`, in `dtype`, with
    the tokenizer of `tokenizer_from`."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars, one per checkpoint, in every learner's log
    plain_model(model_path, plain, dtype).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(path)
    return Path(path)


def meta_peft_model(model_path: str, rank: int, alpha: float, targets: list[str], top_layers: int) -> torch.nn.Module:
    """The run's peft model without weights (meta device): what writing the adapter's config and keys needs."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from asyncrl.core import lora as lora_lib

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path), dtype=torch.float32)
        return lora_lib.wrap(base, rank, alpha, targets, top_layers)
