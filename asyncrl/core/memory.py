"""What a learner rank will hold, computed before any weight is loaded, so that a run that cannot fit fails at once.

The estimate counts what FSDP2 keeps per rank: fp32 master weights, fp32 gradients and AdamW's two fp32 moments
of the trainable parameters, each 1/L of the whole; a reference policy in the compute dtype where one is kept
(sharded, no optimizer state); a critic like the policy; and, in flight, one decoder layer gathered whole in the
compute dtype with its fp32 gradient (two layers: the next is prefetched). Activations are not counted: they
depend on the micro-batch (`learner.gradient_checkpointing` keeps one layer's). With `learner.offload` the
sharded state lives in CPU memory and the device holds the layers in flight only.
"""
from __future__ import annotations

import resource
from dataclasses import dataclass

import torch

GB = 1e9


@dataclass(frozen=True)
class ModelCounts:
    """Parameter counts of the models a learner builds (from the config alone: a meta-device model)."""
    params: int  # the policy's
    trainable: int  # of those, what the optimizer steps (LoRA: the adapter)
    largest_layer: int  # the largest decoder layer's
    critic: int = 0  # the value model's (0: none)


@dataclass(frozen=True)
class MemoryEstimate:
    """GB per rank: on the learner's device, and in host memory (the offloaded state)."""
    params: float
    grads: float
    optimizer: float
    reference: float
    critic: float
    in_flight: float
    offload: bool

    @property
    def sharded(self) -> float:
        return self.params + self.grads + self.optimizer + self.reference + self.critic

    @property
    def device(self) -> float:
        return self.in_flight + (0.0 if self.offload else self.sharded)

    @property
    def host(self) -> float:
        return self.sharded if self.offload else 0.0

    def table(self) -> str:
        rows = [("parameters (fp32 master)", self.params), ("gradients (fp32)", self.grads), ("optimizer (AdamW, fp32)", self.optimizer),
                ("reference policy", self.reference), ("critic (weights, grads, AdamW)", self.critic), ("layers in flight", self.in_flight)]
        where = "host (offloaded)" if self.offload else "device"
        lines = [f"  {name:<32} {gb:8.2f} GB" for name, gb in rows]
        return "\n".join([*lines, f"  {'= on the device':<32} {self.device:8.2f} GB", f"  {'= in host memory':<32} {self.host:8.2f} GB   (sharded state: {where})"])


def estimate(counts: ModelCounts, world: int, compute_bytes: int, reference: bool, offload: bool) -> MemoryEstimate:
    """Per-rank memory of a learner of `world` ranks (see the module's docstring for what is counted)."""
    per_rank = 1.0 / world / GB
    frozen_ref = reference and counts.trainable == counts.params  # with LoRA the reference is the base: no copy
    return MemoryEstimate(
        params=4 * counts.params * per_rank,
        grads=4 * counts.trainable * per_rank,
        optimizer=8 * counts.trainable * per_rank,
        reference=compute_bytes * counts.params * per_rank if frozen_ref else 0.0,
        critic=16 * counts.critic * per_rank,
        in_flight=2 * counts.largest_layer * (compute_bytes + 4) / GB,
        offload=offload,
    )


def device_capacity_gb(device: torch.device) -> float:
    """What the learner's device holds: a GPU's total memory, or on CPUs the machine's memory (MemTotal)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / GB
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GB
    raise RuntimeError("/proc/meminfo has no MemTotal")


def check_fits(est: MemoryEstimate, capacity_gb: float, alternatives: dict[str, MemoryEstimate]) -> None:
    """Raise, naming the numbers and the options that would fit, when `est` needs more than the device has."""
    if est.device <= capacity_gb:
        return
    fits = [f"{name} ({alt.device:.1f} GB)" for name, alt in alternatives.items() if alt.device <= capacity_gb]
    hint = "; options that fit by this estimate: " + ", ".join(fits) if fits else "; none of learner.offload, more learner workers or LoRA fits either"
    raise MemoryError(f"the learner needs {est.device:.1f} GB per rank on its device, which holds {capacity_gb:.1f} GB:\n{est.table()}{hint}")


def model_counts(model_path: str, lora=None, critic: bool = False) -> ModelCounts:
    """Parameter counts of the policy at `model_path` (its config only: built on the meta device, nothing read),
    of what LoRA (`learner.lora`, None: full fine-tuning) trains of it, and of its critic."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from asyncrl.core import lora as lora_lib
    from asyncrl.core.sharding import decoder_layers

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        params = sum(p.numel() for p in model.parameters())
        largest = max(sum(p.numel() for p in layer.parameters()) for layer in decoder_layers(model))
        if lora is not None:
            model = lora_lib.wrap(model, lora.rank, lora.alpha, lora.target_modules, lora.top_layers)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        body = sum(p.numel() for p in AutoModel.from_config(config).parameters()) + config.hidden_size + 1 if critic else 0
    return ModelCounts(params=params, trainable=trainable, largest_layer=largest, critic=body)


def peak_memory_gb(device: torch.device) -> float:
    """This process's peak memory so far: CUDA's max allocated on a GPU, the peak resident set on CPUs."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
