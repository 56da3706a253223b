"""LoRA RL: only a low-rank adapter is trained; the engines get the merged weights of the adapted layers.

Why this exists: on a small budget (these CPUs, one GPU) most users of the peers train a LoRA adapter
(peft), not the whole model. The learner wraps its policy with peft (`learner.lora.rank > 0`); the
optimizer holds only the adapter; the reference policy is the same model with the adapter switched off
(no second copy of the weights).

What goes to the engines is not the adapter but `W + (alpha / r) * B @ A` for every adapted linear layer,
under the checkpoint (Hugging Face) name of its base weight, so the engine runs plain dense layers at full
speed and needs no LoRA support. vLLM fuses q/k/v into one `qkv_proj` and gate/up into `gate_up_proj`; a
fused layer that receives only some of its parts would be left half-loaded, so when one part is adapted its
siblings are sent too (unchanged). Layers not sent keep their weights in the engine.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import torch

FUSED = ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"})
"""Checkpoint layers that vLLM loads into one fused layer: sent together or not at all."""

PEFT_PREFIX = "base_model.model."


def wrap(model: torch.nn.Module, rank: int, alpha: float, targets: list[str], top_layers: int = 0) -> torch.nn.Module:
    """`model` with a fresh LoRA adapter (B = 0: the wrapped model computes exactly what `model` did), on the
    `top_layers` last decoder layers only when > 0: the backward pass then stops below them."""
    from peft import LoraConfig, get_peft_model

    n = model.config.num_hidden_layers
    if top_layers > n:
        raise ValueError(f"learner.lora.top_layers={top_layers}, but the model has {n} layers")
    layers = list(range(n - top_layers, n)) if top_layers > 0 else None
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none", layers_to_transform=layers)
    return get_peft_model(model, config)


def sync_modules(model: torch.nn.Module) -> list[str]:
    """Checkpoint names of the linear modules whose weights a sync sends: the adapted ones and their fused siblings."""
    from peft.tuners.lora import LoraLayer

    adapted = {name.removeprefix(PEFT_PREFIX) for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    chosen = set(adapted)
    for name in adapted:
        parent, _, leaf = name.rpartition(".")
        for group in FUSED:
            if leaf in group:
                chosen |= {f"{parent}.{sibling}" for sibling in group}
    order = [n.removeprefix(PEFT_PREFIX) for n, _ in model.named_modules()]
    return [n for n in order if n in chosen]


def base_weight(model: torch.nn.Module, name: str) -> torch.Tensor:
    """The (possibly sharded) base weight of checkpoint module `name` inside the peft model."""
    from peft.tuners.lora import LoraLayer

    module = model.get_submodule(PEFT_PREFIX + name)
    return module.get_base_layer().weight if isinstance(module, LoraLayer) else module.weight


def merged_weight(model: torch.nn.Module, name: str, full: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.detach) -> torch.Tensor:
    """The dense weight the engine should hold for checkpoint module `name`: base + (alpha / r) * B @ A for each
    active adapter. `full` turns a (sharded) parameter into the whole tensor: the identity on an unsharded model, a
    gather under FSDP (every rank must then call this for the same names, in the same order)."""
    from peft.tuners.lora import LoraLayer

    module = model.get_submodule(PEFT_PREFIX + name)
    if not isinstance(module, LoraLayer):
        return full(module.weight)
    merged = full(module.get_base_layer().weight).clone()
    for adapter in module.active_adapters:
        if adapter not in module.lora_A:
            continue
        a, b = full(module.lora_A[adapter].weight), full(module.lora_B[adapter].weight)  # [r, in], [out, r]
        delta = (b.float() @ a.float()) * module.scaling[adapter]  # [out, in]
        merged += (delta.T if module.fan_in_fan_out else delta).to(merged.dtype)
    return merged


def merge_state_dict(state: dict[str, torch.Tensor], scaling: float, adapter: str = "default") -> dict[str, torch.Tensor]:
    """A peft model's whole state dict (`base_model.model.` keys, `base_layer` and `lora_A/B.<adapter>` weights)
    as the plain model's: each adapted weight is W + scaling * B @ A, every other tensor as it is."""
    plain: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
        plain[name] = tensor
        if key.endswith(".base_layer.weight"):  # an adapted layer's bias stays as it is
            stem = key.rsplit(".base_layer.", 1)[0]
            a, b = state[f"{stem}.lora_A.{adapter}.weight"], state[f"{stem}.lora_B.{adapter}.weight"]
            plain[name] = tensor + ((b.float() @ a.float()) * scaling).to(tensor.dtype)
    return plain


def save_adapter(model: torch.nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """The adapter alone as a peft directory (adapter_config.json, adapter_model.safetensors), from the peft model's
    whole state dict (`state`, gathered): `PeftModel.from_pretrained(base, path)` loads it."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    model.peft_config["default"].save_pretrained(path)
    adapter = get_peft_model_state_dict(model, state_dict=state)
    save_file({k: v.contiguous() for k, v in adapter.items()}, f"{path}/adapter_model.safetensors")
