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


def merged_weight(model: torch.nn.Module, name: str) -> torch.Tensor:
    """The dense weight the engine should hold for checkpoint module `name`: base + the adapter's delta, if any."""
    from peft.tuners.lora import LoraLayer

    module = model.get_submodule(PEFT_PREFIX + name)
    if not isinstance(module, LoraLayer):
        return module.weight.detach()
    base = module.get_base_layer().weight.detach()
    delta = sum((module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A), torch.zeros_like(base))
    return base + delta.to(base.dtype)


def merged_named_weights(model: torch.nn.Module, modules: list[str]) -> list[tuple[str, torch.Tensor]]:
    """(checkpoint weight name, merged weight) for each module of `modules` (see `sync_modules`)."""
    with torch.no_grad():
        return [(f"{name}.weight", merged_weight(model, name)) for name in modules]
