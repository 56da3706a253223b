"""The learner group: L processes, one torch.distributed group, FSDP2 data-parallel updates.

The policy (and the critic, and the reference where one is needed) is sharded with PyTorch's FSDP2
(`fully_shard`) over a one-dimensional device mesh of the group: each decoder layer is one FSDP unit and the
root holds the rest. Every rank keeps 1/L of the fp32 master weights, their gradients and the optimizer
state; a forward or backward pass gathers one layer at a time in the compute dtype (`MixedPrecisionPolicy`),
and gradients are reduce-scattered in fp32. World size 1 runs the same code over a one-process group.

Each step, every worker collates the same batch, computes the no-grad passes (proximal, reference, critic)
on its rows and all-gathers them (`gather_rows`), so advantages see the whole batch exactly as with one
worker; then each takes its shard of every mini-batch (`shard`). FSDP averages gradients over the group;
the learner rescales them to the sum over every worker's loss units divided by their total, so the update
is the one a single worker makes on the whole batch (tested to fp32 tolerance).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class GroupInfo:
    rank: int = 0
    world: int = 1
    mesh: DeviceMesh | None = None


def init_learner_group(host: str, port: int, rank: int, world: int, backend: str, device: torch.device, name: str,
                       listener=None, timeout_s: float = 300.0) -> GroupInfo:
    """Join the group (this process's default torch.distributed group) and build its mesh on `device`'s type. Its
    store is rank 0's, on `listener` (bound to `host` only), its keys under the per-group secret `name`
    (asyncrl.core.weights.open_store, group_name)."""
    from asyncrl.core.weights import open_store

    timeout = timedelta(seconds=timeout_s)
    store = dist.PrefixStore(name, open_store(host, port, rank, world, timeout, listener))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return GroupInfo(rank, world, init_device_mesh(device.type, (world,)))


def single_group(backend: str, device: torch.device) -> GroupInfo:
    """World size 1: a one-process default group (shared by every learner of this process), so that FSDP2 runs
    the same code as at world L."""
    if not dist.is_initialized():
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if dist.get_world_size() != 1:
        raise RuntimeError(f"this process is in a group of {dist.get_world_size()}: a learner of world 1 cannot join it")
    return GroupInfo(0, 1, init_device_mesh(device.type, (1,)))


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
    t = torch.tensor([value], dtype=torch.float64, device=_comm_device(g))
    dist.all_reduce(t)
    return t.item()


def max_int(value: int, g: GroupInfo) -> int:
    """The largest `value` over the group's workers."""
    if g.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_comm_device(g))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


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
        t = torch.tensor([metrics[k] for k in selected], dtype=torch.float64, device=_comm_device(g))
        dist.all_reduce(t, op=op)
        out.update(zip(selected, t.tolist()))
    return out


def _comm_device(g: GroupInfo) -> torch.device:
    """Where a collective's tensors must live: the mesh's device type (NCCL reduces CUDA tensors only)."""
    if g.mesh is None or g.mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(g.mesh.device_type, torch.cuda.current_device())


def full_tensor(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The whole tensor on every rank (a collective for a sharded DTensor: every rank must call it, in the same
    order). A shard offloaded to the CPU is moved to `device` first, where the group's backend can gather it."""
    if not isinstance(t, DTensor):
        return t.detach()
    local = t.to_local()
    if local.device != device:
        t = DTensor.from_local(local.to(device), t.device_mesh, t.placements, shape=t.shape, stride=t.stride())
    return t.full_tensor().detach()


def close(g: GroupInfo) -> None:
    """Leave a group of L > 1 (the one-process group of world 1 is shared by this process's learners: it stays)."""
    if g.world > 1 and dist.is_initialized():
        dist.destroy_process_group()
