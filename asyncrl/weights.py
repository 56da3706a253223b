"""Weight transport: learner rank 0 sends flat buckets to every engine worker.

Two transports over one bucket plan (`learner.weight_transport`):
- ``broadcast`` (CPUs and GPUs): vLLM's stateless torch.distributed group
  (gloo on CPUs, NCCL on GPUs), the group's own `broadcast`.
- ``cuda_ipc`` (learner and engine colocated on one GPU, where NCCL cannot
  connect two processes on the same device): each bucket is exported as a CUDA
  IPC handle (torch's `reduce_tensor`) that travels by Ray; the engine maps it
  without a copy (`rebuild_cuda_tensor`), as vLLM's own weight cache does.
Both ends compute the same bucket plan from the same metadata, so only raw
bytes (or handles) cross; names and shapes travel once, by Ray.
"""
from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import BroadcastOptions


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # "float32", "bfloat16", ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


def tensor_meta(named: Iterator[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    return [TensorMeta(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in named]


def plan_buckets(meta: list[TensorMeta], bucket_bytes: int) -> list[list[int]]:
    """Consecutive same-dtype tensors packed up to `bucket_bytes`; a larger tensor goes alone."""
    buckets: list[list[int]] = []
    size = 0
    for i, m in enumerate(meta):
        fits = buckets and size + m.nbytes <= bucket_bytes and meta[buckets[-1][0]].dtype == m.dtype
        if fits:
            buckets[-1].append(i)
            size += m.nbytes
        else:
            buckets.append([i])
            size = m.nbytes
    return buckets


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_group(host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float = 300.0):
    """Join the weight-broadcast group (rank 0 is the learner)."""
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    return stateless_init_torch_distributed_process_group(
        host, port, rank, world_size, backend=backend, timeout=timedelta(seconds=timeout_s)
    )


def _broadcast(group, tensor: torch.Tensor) -> None:
    opts = BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def send_weights(group, tensors: list[torch.Tensor], buckets: list[list[int]]) -> int:
    """Rank 0: broadcast each bucket as one flat tensor; returns bytes sent."""
    sent = 0
    for bucket in buckets:
        flat = pack(tensors, bucket)
        _broadcast(group, flat)
        sent += flat.numel() * flat.element_size()
    return sent


def pack(tensors: list[torch.Tensor], bucket: list[int]) -> torch.Tensor:
    return torch.cat([tensors[i].detach().reshape(-1) for i in bucket])


def unpack(flat: torch.Tensor, meta: list[TensorMeta], bucket: list[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, view) for each tensor of `bucket` inside its flat buffer."""
    offset = 0
    for i in bucket:
        m = meta[i]
        yield m.name, flat[offset : offset + m.numel].view(m.shape)
        offset += m.numel


def receive_weights(
    group, meta: list[TensorMeta], buckets: list[list[int]], device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Other ranks: receive each bucket and yield (name, tensor) views into it."""
    for bucket in buckets:
        dtype = getattr(torch, meta[bucket[0]].dtype)
        flat = torch.empty(sum(meta[i].numel for i in bucket), dtype=dtype, device=device)
        _broadcast(group, flat)
        yield from unpack(flat, meta, bucket)


def share_weights_ipc(tensors: list[torch.Tensor], buckets: list[list[int]]) -> tuple[list[tuple], list[torch.Tensor]]:
    """Colocated rank 0: (one CUDA IPC handle per bucket, the packed buffers). Keep the buffers
    alive until every engine has loaded them; the handles are picklable and go by Ray."""
    from torch.multiprocessing.reductions import reduce_tensor

    flats = [pack(tensors, b) for b in buckets]
    return [reduce_tensor(f)[1] for f in flats], flats


def open_weights_ipc(
    handles: list[tuple], meta: list[TensorMeta], buckets: list[list[int]], device_index: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Engine side: map each bucket's handle on this process's device and yield (name, view)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    for handle, bucket in zip(handles, buckets):
        args = list(handle)
        args[6] = device_index  # the sender's device index; CUDA_VISIBLE_DEVICES may differ here
        yield from unpack(rebuild_cuda_tensor(*args), meta, bucket)
