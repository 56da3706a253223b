"""FSDP2 for the learner's models: which modules are FSDP units, the mixed-precision and offload policies.

Why this exists: a model is bounded by the learner pool, not by one device, only when its weights, gradients
and optimizer state are sharded; and small learning rates survive bf16 compute only when the optimizer steps
fp32 master weights. `shard_model` applies `fully_shard` to every decoder layer (the classes the Hugging
Face model names in `_no_split_modules`) and then to the root, with the master weights in fp32 and the
forward and backward passes in the compute dtype.
"""
from __future__ import annotations

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from asyncrl.core.learner_group import GroupInfo


def mixed_precision(compute_dtype: torch.dtype) -> MixedPrecisionPolicy:
    """Forward and backward in `compute_dtype`, gradients reduced in fp32 (the master weights' dtype)."""
    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of `model` whose class a Hugging Face model inside it lists in `_no_split_modules` (its decoder
    layers), in order; wrappers (peft, the critic) are searched through."""
    names: set[str] = set()
    for module in model.modules():
        names |= set(getattr(module, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layer found to shard (no `_no_split_modules` class in it)")
    return layers


def shard_model(model: torch.nn.Module, group: GroupInfo, compute_dtype: torch.dtype, offload: bool) -> torch.nn.Module:
    """Shard `model` in place over the group's mesh: each decoder layer, then the root (embeddings, norm, head).
    With `offload` the shards, their gradients and the optimizer state live in CPU memory (FSDP2's
    CPUOffloadPolicy: the optimizer steps on the CPU) and each layer is copied to the device for its passes."""
    policy: OffloadPolicy = CPUOffloadPolicy() if offload else OffloadPolicy()
    # the root reshards after its forward too: the no-grad passes (proximal, reference, critic) have no backward to
    # reshard it, and an unsharded root would hold the whole embedding and head (and hand out its unsharded
    # parameters from `model.parameters()`)
    options = {"mesh": group.mesh, "mp_policy": mixed_precision(compute_dtype), "offload_policy": policy, "reshard_after_forward": True}
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model
