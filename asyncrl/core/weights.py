"""Weight transport: learner rank 0 sends flat buckets to every engine worker.

Two transports over one bucket plan (`learner.weight_transport`):
- ``broadcast`` (CPUs and GPUs): a torch.distributed group outside the default one
  (gloo on CPUs, NCCL on GPUs; `init_group`, the protocol SGLang joins with), each
  bucket broadcast as its bytes.
- ``cuda_ipc`` (learner and engine colocated on one GPU, where NCCL cannot
  connect two processes on the same device): each bucket is exported as a CUDA
  IPC handle (torch's `reduce_tensor`) that travels by Ray; the engine maps it
  without a copy (`rebuild_cuda_tensor`), as vLLM's own weight cache does.
Both ends compute the same bucket plan from the same metadata, so only raw
bytes (or handles) cross; names and shapes travel once, by Ray.
"""
from __future__ import annotations

import secrets
import socket
import threading
import weakref
from collections.abc import Iterable, Iterator
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


def listen_socket(host: str) -> socket.socket:
    """A socket bound to `host` on a free port and listening: a group's store is hosted on it (`open_store`), so it
    listens on that address only (loopback on one node) and no other process can take the port in between."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def new_secret() -> str:
    """A per-group secret (128 bits), handed to every rank through Ray: the group's store prefix (`group_name`)."""
    return secrets.token_hex(16)


def group_name(secret: str) -> str:
    """The weight group's name and its store prefix. Built from a per-group secret (`new_secret`), so a process that
    reaches the store's port cannot guess the keys of the group's rendezvous (it cannot join it, nor write a key the
    ranks read); a new group (a worker restarted) gets a new secret, so a new name, which torch requires of groups in
    one process."""
    return f"asyncrl-weights-{secret}"


def open_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta, listener: socket.socket | None = None):
    """The group's TCP store at host:port: rank 0 hosts it, on `listener` when given (bound to `host` only; without
    one, torch binds every interface), the others connect. The same protocol as torch's `tcp://` rendezvous, so SGLang's
    own `init_weights_update_group` connects to it as any rank > 0."""
    from torch.distributed import TCPStore

    if rank == 0:
        return TCPStore(host, port, world_size, True, timeout, wait_for_workers=False,
                        master_listen_fd=listener.fileno() if listener is not None else None)
    return TCPStore(host, port, world_size, False, timeout)


def init_group(host: str, port: int, rank: int, world_size: int, backend: str, name: str, timeout_s: float = 300.0,
               listener: socket.socket | None = None):
    """Join the weight-broadcast group `name` (`group_name`; rank 0 is the learner, hosting the store on `listener`).

    The protocol is the one SGLang's `init_weights_update_group` speaks (and verl's and OpenRLHF's trainers): a
    TCP store at host:port that rank 0 hosts, a PrefixStore named after the group, and torch's
    `_new_process_group_helper` for a group outside any default process group. So vLLM workers, SGLang schedulers
    and the learner all join the same group with their own code, and no default group is needed on any side."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

    timeout = timedelta(seconds=timeout_s)
    store = open_store(host, port, rank, world_size, timeout, listener)
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), PrefixStore(name, store),
                                      group_name=name, backend_options=None, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def _broadcast(group, tensor: torch.Tensor):
    """Post a broadcast from rank 0 on `group`; returns its work (`.wait()` completes it). A flat buffer goes as
    its bytes, the wire format SGLang's flattened buckets receive into (uint8), whatever the weights' dtype."""
    opts = BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([tensor.view(torch.uint8) if tensor.dim() == 1 else tensor], opts)


def bucket_buffers(meta: list[TensorMeta], buckets: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """One flat buffer per bucket, zero-filled so that its pages are touched now, not during a sync."""
    return [torch.zeros(sum(meta[i].numel for i in b), dtype=getattr(torch, meta[b[0]].dtype), device=device) for b in buckets]


def pack(tensors: list[torch.Tensor], bucket: list[int]) -> torch.Tensor:
    return torch.cat([tensors[i].detach().reshape(-1) for i in bucket])


def flatten_into_buckets(params: list[torch.Tensor], buckets: list[list[int]]) -> list[torch.Tensor]:
    """Move `params` into one contiguous buffer per bucket: each parameter's data becomes a view of its
    bucket's buffer, so that a bucket is sent as it is, with no packing. The Parameter objects stay the same,
    so modules, optimizers and `state_dict` see no change (Hugging Face saves such disjoint views correctly)."""
    meta = tensor_meta((str(i), p) for i, p in enumerate(params))
    buffers = bucket_buffers(meta, buckets, params[0].device)
    with torch.no_grad():
        for bucket, buffer in zip(buckets, buffers):
            for (_, view), i in zip(unpack(buffer, meta, bucket), bucket):
                view.copy_(params[i])
                params[i].data = view
    return buffers


class WeightSender:
    """Rank 0 of the weight group: publishes the weights and returns without waiting for the receivers.

    `publish(flats)` posts each flat bucket as it comes (the learner gathers them from its shards one at a time)
    and keeps at most `window` of them in flight: a bucket's memory goes once its broadcast has completed, so the
    extra memory of a sync is `window` buckets, not a model. Without `flats` it sends the fixed `buffers` given at
    construction (tensors living in their send buckets: `flatten_into_buckets`), whose owner calls `wait()` before
    changing them. The next `publish` completes the previous one first: one version in flight at a time.
    """

    def __init__(self, group, buffers: list[torch.Tensor] | None = None, window: int = 2) -> None:
        self.group, self.buffers, self.window = group, buffers, window
        self.pending: list[tuple[object, torch.Tensor]] = []

    def publish(self, flats: Iterable[torch.Tensor] | None = None) -> int:
        """Post every bucket; returns the bytes posted."""
        self.wait()
        sent = 0
        for flat in (self.buffers if flats is None else flats):
            if flats is not None and len(self.pending) >= self.window:
                self.pending.pop(0)[0].wait()
            self.pending.append((_broadcast(self.group, flat), flat))
            sent += flat.numel() * flat.element_size()
        return sent

    def wait(self) -> None:
        """Complete the version in flight; a receiver that died makes this raise (gloo: at once)."""
        pending, self.pending = self.pending, []
        for work, _ in pending:
            work.wait()


def unpack(flat: torch.Tensor, meta: list[TensorMeta], bucket: list[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, view) for each tensor of `bucket` inside its flat buffer."""
    offset = 0
    for i in bucket:
        m = meta[i]
        yield m.name, flat[offset : offset + m.numel].view(m.shape)
        offset += m.numel


class WeightReceiver:
    """The other ranks: every bucket's receive is posted at once (gloo works through them in order while the
    first completes) and the (name, view) pairs are returned when all have arrived.

    Nothing is handed to the loader before the last bucket is in: a receive that fails half-way (a peer died)
    then leaves the engine's weights untouched, where a streamed `reload_weights` would leave layers half-loaded.
    `keep_buffers` (the default on CPUs) allocates the receive buffers once, touched, and reuses them: a fresh
    CPU allocation pays its page faults inside every sync (measured: 0.85 s for a 0.5B model, longer than the
    0.55 s transfer). On CUDA the caching allocator already reuses blocks, so buffers are allocated per sync and
    freed after the load rather than holding a second copy of the weights on the GPU.
    The views are valid until the next `receive`.
    """

    def __init__(self, group, meta: list[TensorMeta], buckets: list[list[int]], device: torch.device, keep_buffers: bool | None = None) -> None:
        self.group, self.meta, self.buckets, self.device = group, meta, buckets, device
        keep = device.type == "cpu" if keep_buffers is None else keep_buffers
        self.buffers = bucket_buffers(meta, buckets, device) if keep else None
        self.nbytes = sum(m.nbytes for m in meta)
        self.abandoned = threading.Event()  # `abandon_receives`: the group's broadcast is broken for good
        _RECEIVERS.add(self)

    def receive(self) -> list[tuple[str, torch.Tensor]]:
        """Every bucket, or a RuntimeError once the group is abandoned (checked every few milliseconds while a
        bucket is under way: gloo tells a receiver nothing when the sender gives up on another receiver)."""
        buffers = self.buffers if self.buffers is not None else bucket_buffers(self.meta, self.buckets, self.device)
        works = [_broadcast(self.group, b) for b in buffers]
        for work in works:
            while not work.is_completed():
                if self.abandoned.wait(0.002):
                    raise RuntimeError("the weight broadcast was abandoned: the learner gave up on an engine that froze or died during it")
            work.wait()
        return [pair for buffer, bucket in zip(buffers, self.buckets) for pair in unpack(buffer, self.meta, bucket)]


_RECEIVERS: weakref.WeakSet = weakref.WeakSet()  # this process's receivers (one per group it joined)


def abandon_receives() -> int:
    """Make every receive under way in this process (and any later one on the same groups) fail at once: the sender
    gave up on the broadcast, and the group is rebuilt before the next version. How many receivers there were."""
    receivers = list(_RECEIVERS)
    for receiver in receivers:
        receiver.abandoned.set()
    return len(receivers)


def open_weights_ipc(
    handles: list[tuple], meta: list[TensorMeta], buckets: list[list[int]], device_index: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Engine side: map each bucket's handle on this process's device and yield (name, view)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    for handle, bucket in zip(handles, buckets):
        args = list(handle)
        args[6] = device_index  # the sender's device index; CUDA_VISIBLE_DEVICES may differ here
        yield from unpack(rebuild_cuda_tensor(*args), meta, bucket)


# ---- the transport interface: one per side, chosen by name in `make_sender` / `make_receiver` only ----------------

class BroadcastSender:
    """Learner rank 0 over a torch.distributed group (gloo / NCCL): streams the buckets it is given, no payload."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.sender: WeightSender | None = None

    def connect(self, host: str, port: int, world_size: int, name: str, listener: socket.socket | None = None) -> None:
        if self.sender is not None:  # a version still in flight to the old group is abandoned
            try:
                self.sender.wait()
            except RuntimeError:  # a receiver of the old group died: that is why the group is being rebuilt
                pass
        self.sender = WeightSender(init_group(host, port, 0, world_size, self.backend, name, listener=listener))

    def send(self, flats: Iterable[torch.Tensor]) -> tuple[int, None]:
        return self.sender.publish(flats), None

    def wait(self) -> None:
        if self.sender is not None:
            self.sender.wait()

    def release(self) -> None:
        """Every engine has loaded the version (nothing to free: the buffers are reused)."""


class CudaIpcSender:
    """Learner rank 0 colocated with the engines on one GPU: keeps the gathered buckets of a version as its snapshot
    and hands out one CUDA IPC handle per bucket as the payload; the snapshot (a whole copy of the weights in the
    engines' dtype) lives until every engine has loaded it (`release`)."""

    def __init__(self) -> None:
        self.snapshot: list[torch.Tensor] = []

    def connect(self, host: str, port: int, world_size: int, name: str, listener: socket.socket | None = None) -> None:
        """No group: the handles travel with each version."""

    def send(self, flats: Iterable[torch.Tensor]) -> tuple[int, list[tuple]]:
        from torch.multiprocessing.reductions import reduce_tensor

        self.snapshot = list(flats)
        handles = [reduce_tensor(f)[1] for f in self.snapshot]
        return sum(b.numel() * b.element_size() for b in self.snapshot), handles

    def wait(self) -> None:
        """The snapshot is a copy: the parameters may change at once."""

    def release(self) -> None:
        self.snapshot = []


class BroadcastReceiver:
    """An engine worker's end of the group: receives every bucket, then hands over the (name, tensor) pairs."""

    def __init__(self, backend: str, meta: list[TensorMeta], buckets: list[list[int]], device: torch.device) -> None:
        self.backend, self.meta, self.buckets, self.device = backend, meta, buckets, device
        self.receiver: WeightReceiver | None = None
        self.nbytes = sum(m.nbytes for m in meta)

    def connect(self, host: str, port: int, rank: int, world_size: int, name: str) -> None:
        self.receiver = WeightReceiver(init_group(host, port, rank, world_size, self.backend, name), self.meta, self.buckets, self.device)

    def receive(self, payload: None) -> list[tuple[str, torch.Tensor]]:
        return self.receiver.receive()


class CudaIpcReceiver:
    """An engine worker on the learner's GPU: maps the learner's buckets from their handles (no copy on the wire)."""

    def __init__(self, meta: list[TensorMeta], buckets: list[list[int]], device: torch.device) -> None:
        self.meta, self.buckets, self.device = meta, buckets, device
        self.nbytes = sum(m.nbytes for m in meta)

    def connect(self, host: str, port: int, rank: int, world_size: int, name: str) -> None:
        """No group: the handles come with each version."""

    def receive(self, payload: list[tuple]) -> list[tuple[str, torch.Tensor]]:
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return list(open_weights_ipc(payload, self.meta, self.buckets, index))


TRANSPORTS = ("broadcast", "cuda_ipc")


def make_sender(transport: str, backend: str) -> BroadcastSender | CudaIpcSender:
    """The learner's end of `learner.weight_transport`; its `send(flats)` takes the flat buckets of one version."""
    if transport == "cuda_ipc":
        return CudaIpcSender()
    if transport == "broadcast":
        return BroadcastSender(backend)
    raise ValueError(f"weight transport {transport!r}: expected one of {TRANSPORTS}")


def make_receiver(transport: str, backend: str, meta: list[TensorMeta], buckets: list[list[int]],
                  device: torch.device) -> BroadcastReceiver | CudaIpcReceiver:
    """An engine worker's end of `learner.weight_transport`."""
    if transport == "cuda_ipc":
        return CudaIpcReceiver(meta, buckets, device)
    if transport == "broadcast":
        return BroadcastReceiver(backend, meta, buckets, device)
    raise ValueError(f"weight transport {transport!r}: expected one of {TRANSPORTS}")
