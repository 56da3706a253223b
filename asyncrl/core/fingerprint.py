"""Fingerprints of weights: does an engine serve the weights the learner sent?

A tensor's fingerprint is a fixed random projection, computed where the weights live: for a tensor of shape
(rows, ...) the vector `t.reshape(rows, -1) @ r`, r a vector of +1/-1 drawn from a generator seeded by its length
(the same on every process); for a 1-D tensor the number `t @ r`. The learner computes it from the tensors it sent;
an engine computes it from what it serves after the load, through its own kernels (vLLM's CPU backend repacks its
linear layers, so their weights cannot be read back: the layer is applied to r instead, which gives the same vector).
A projection is linear, so a fused layer's (q, k and v in one `qkv_proj`) is its parts' vectors one after the
other: the engine splits it at the parts' output sizes and fingerprints every checkpoint tensor by its own name.

Only some rows need be checked: with `stride` k > 1 the learner projects rows phase, phase + k, ... of each tensor
of two or more dimensions (a different phase each sync) and leaves the others NaN, which `compare` skips (a
checked row whose weights are not finite is +inf, never NaN: it is compared, and fails, rather than skipped). That
cuts the learner's share, a read of every weight it sends, k times; an engine's stays a full read (its kernel
gives every row at once). A tensor wrong in every row (not loaded, a LoRA merge left out, a fused part misplaced)
is caught at the first sync; one wrong in a single row, at the latest after k syncs if it persists.

The engine's kernels round differently than the learner's, so two fingerprints match element by element within a
tolerance set by the served dtype (`TOLERANCE`): a garbled tensor, one left unloaded or a LoRA merge that never
arrived moves its vector far more; a change smaller than the served dtype's rounding of a product is not seen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

TOLERANCE = {"float32": (1e-5, 1e-5), "float64": (1e-9, 1e-9), "bfloat16": (2**-7, 2**-8), "float16": (2**-10, 2**-11)}
"""(rtol, atol) by served dtype: an element of a served fingerprint matches when |served - sent| <= rtol * |sent| +
atol * max |sent|. The learner's is exact (float32 sums of the sent values); an engine's bf16 kernel rounds its
partial sums: on SmolLM2-135M (vLLM, CPU) the largest difference seen was 0.31 of this bf16 allowance, and 0 in
float32 (tests/test_fingerprint.py says what a change must be to be seen)."""


@lru_cache(maxsize=64)
def _signs(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0x5EED + n)
    return (torch.randint(0, 2, (n,), generator=g, dtype=torch.int8) * 2 - 1).to(torch.float32)


def probe_vector(n: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The +1/-1 vector of length n every process draws the same (exact in any float dtype)."""
    return _signs(n).to(device=device, dtype=dtype)


def fingerprint(t: torch.Tensor, stride: int = 1, phase: int = 0) -> torch.Tensor:
    """`t`'s projection on the probe vector, in float32 on the CPU: a vector of t's first dimension (a 1-D tensor:
    one number). With `stride` > 1 only rows phase, phase + stride, ... are projected, the others NaN (unchecked);
    a projected row of non-finite weights is +inf, so NaN always means "not checked"."""
    with torch.no_grad():
        x = t.detach()
        if x.dim() == 0:
            return _checked(x.float().reshape(1).cpu())
        if x.dim() == 1:
            return _checked((x.float() @ probe_vector(x.numel(), torch.float32, x.device)).reshape(1).cpu())
        flat = x.reshape(x.shape[0], -1)
        r = probe_vector(flat.shape[1], torch.float32, x.device)
        if stride <= 1:
            return _checked((flat.float() @ r).cpu())
        out = torch.full((flat.shape[0],), float("nan"))
        out[phase % stride :: stride] = _checked((flat[phase % stride :: stride].float() @ r).cpu())
        return out


def _checked(values: torch.Tensor) -> torch.Tensor:
    """A projection whose weights held a NaN is NaN: made +inf, which `compare` compares (and fails) instead of
    skipping it as a row left unchecked."""
    return values.nan_to_num(nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))


@dataclass(frozen=True)
class Mismatch:
    """The first tensor (in the sync's order) whose served fingerprint is not the sent one."""
    name: str
    excess: float  # max over elements of |served - sent| / its tolerance (> 1); inf when nothing or NaN is served
    row: int = -1
    served: float = float("nan")
    sent: float = float("nan")

    @property
    def learner_side(self) -> bool:
        """The learner sent non-finite weights in the row compared: no engine can serve them right."""
        return self.row >= 0 and not math.isfinite(self.sent)

    def describe(self) -> str:
        if self.row < 0:
            return f"{self.name}: the engine serves no such weight after the load"
        if self.learner_side:
            return f"{self.name}: row {self.row} of the weights the learner sent is not finite (its fingerprint {self.sent:.6g})"
        return (f"{self.name}: row {self.row} of its fingerprint is {self.served:.6g} served, {self.sent:.6g} sent "
                f"({self.excess:.3g} times the tolerance)")


def compare(name: str, served: torch.Tensor | None, sent: torch.Tensor, dtype: str) -> Mismatch | None:
    """None when `served` matches `sent` element by element within `TOLERANCE[dtype]`; rows the learner left NaN
    (not checked this sync) are skipped."""
    if served is None or served.shape != sent.shape:
        return Mismatch(name, float("inf"))
    rtol, atol = TOLERANCE.get(dtype, TOLERANCE["float32"])
    served, sent = served.double(), sent.double()
    checked = ~sent.isnan()
    finite = checked & sent.isfinite()
    scale = float(sent[finite].abs().max()) if finite.any() else 0.0
    allowed = rtol * sent.abs() + atol * scale
    excess = ((served - sent).abs() - allowed).nan_to_num(nan=float("inf")).masked_fill(~checked, float("-inf"))
    if not (excess > 0).any():
        return None
    row = int(torch.argmax(excess))
    ratio = float((served[row] - sent[row]).abs() / allowed[row]) if allowed[row] > 0 else float("inf")
    return Mismatch(name, ratio if ratio == ratio else float("inf"), row, float(served[row]), float(sent[row]))


def first_mismatch(sent: dict[str, torch.Tensor], served: dict[str, torch.Tensor | None], dtype: str) -> Mismatch | None:
    """Compare an engine's fingerprints with the learner's, tensor by tensor in the learner's order; None when every
    one matches within the served dtype's tolerance."""
    for name, want in sent.items():
        got = served.get(name)
        if (m := compare(name, None if got is None else torch.as_tensor(got), torch.as_tensor(want), dtype)) is not None:
            return m
    return None


class WeightMismatch(RuntimeError):
    """An engine does not serve the weights the learner sent: names the engine, the version and the tensor."""

    def __init__(self, engine: int, version: int, mismatch: Mismatch, again: bool = False) -> None:
        self.engine, self.version, self.mismatch = engine, version, mismatch
        twice = ", again after the version was sent a second time" if again else ""
        if mismatch.learner_side:
            super().__init__(f"the learner sent weight version {version} with non-finite values (found by rollout worker "
                             f"{engine}'s verification): {mismatch.describe()}")
        else:
            super().__init__(f"rollout worker {engine} does not serve weight version {version} as the learner sent it{twice}: "
                             f"{mismatch.describe()}")


# ----------------------------------------------------------------------------- where a checkpoint tensor is served
def locate(modules: dict[str, object], packed: dict[str, list[str]], name: str) -> tuple[str, str, int, int | None]:
    """Where an engine serves checkpoint tensor `name` (e.g. `model.layers.0.self_attn.q_proj.weight`): (module path,
    parameter name, row offset, rows or None for all). A module fused from several checkpoint modules (`packed`, the
    model's `packed_modules_mapping`: {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}) holds its part at the offset of
    the parts before it, by the module's `output_sizes`. KeyError when no module serves it."""
    path, _, leaf = name.rpartition(".")
    if path in modules:
        return path, leaf, 0, None
    parent, _, child = path.rpartition(".")
    for fused, parts in packed.items():
        where = f"{parent}.{fused}" if parent else fused
        if child in parts and where in modules:
            sizes = list(getattr(modules[where], "output_partition_sizes", None) or modules[where].output_sizes)
            i = parts.index(child)
            return where, leaf, sum(sizes[:i]), sizes[i]
    raise KeyError(name)
