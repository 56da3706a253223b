"""The learner group: L processes, one torch.distributed group, data-parallel updates.

Every learner worker holds the whole model (DDP semantics; FSDP would shard it).
Each step, every worker collates the same batch, computes the no-grad passes
(proximal, reference, critic) on its rows and all-gathers them, so advantages
see the whole batch exactly as with one worker; then each takes its shard of
every mini-batch, accumulates gradients, and the gradients and loss units are
summed over the group before the optimizer step. The result is the update one
worker would make on the whole batch (tested to fp32 tolerance).

With world size 1 every function here is the identity, so the single-learner
path runs the same code.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class GroupInfo:
    rank: int = 0
    world: int = 1


def init_learner_group(host: str, port: int, rank: int, world: int, backend: str, timeout_s: float = 300.0) -> GroupInfo:
    """Join the group (this process's default torch.distributed group)."""
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    return GroupInfo(rank, world)


def shard(rows: torch.Tensor, g: GroupInfo) -> torch.Tensor:
    """This worker's contiguous share of `rows` (world size divides len(rows): validated in the config)."""
    return rows.chunk(g.world)[g.rank] if g.world > 1 else rows


def gather_rows(part: torch.Tensor, g: GroupInfo) -> torch.Tensor:
    """Concatenate every worker's `part` in rank order (the inverse of `shard` on contiguous rows)."""
    if g.world == 1:
        return part
    parts = [torch.empty_like(part) for _ in range(g.world)]
    dist.all_gather(parts, part.contiguous())
    return torch.cat(parts)


def sum_scalar(value: float, g: GroupInfo) -> float:
    if g.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


def sum_grads(params: list[torch.Tensor], g: GroupInfo) -> None:
    """Sum .grad over the group, in one flat buffer (a missing grad counts as zero)."""
    if g.world == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([t.reshape(-1) for t in grads])
    dist.all_reduce(flat)
    offset = 0
    for p, t in zip(params, grads):
        p.grad = flat[offset : offset + t.numel()].view_as(p).clone()
        offset += t.numel()


def reduce_metrics(metrics: dict[str, float], g: GroupInfo) -> dict[str, float]:
    """Sum weighted means over the group; keys ending /max or /min keep the extreme."""
    if g.world == 1:
        return metrics
    keys = sorted(metrics)
    out = {}
    for op, selected in ((dist.ReduceOp.MAX, [k for k in keys if k.endswith("/max")]),
                         (dist.ReduceOp.MIN, [k for k in keys if k.endswith("/min")]),
                         (dist.ReduceOp.SUM, [k for k in keys if not k.endswith(("/max", "/min"))])):
        if not selected:
            continue
        t = torch.tensor([metrics[k] for k in selected], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        out.update(zip(selected, t.tolist()))
    return out


def broadcast_params(params: list[torch.Tensor], g: GroupInfo) -> None:
    """Make every worker start from rank 0's weights."""
    if g.world == 1:
        return
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)


def close(g: GroupInfo) -> None:
    if g.world > 1 and dist.is_initialized():
        dist.destroy_process_group()
