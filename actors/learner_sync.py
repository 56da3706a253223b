"""The learner's end of the weight sync: what a sync sends, gathered from the shards bucket by bucket, and the sender.

The engines' end is `asyncrl.core.weights`' receivers; the controller coordinates the two
(asyncrl/orchestration/weight_sync.py).
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from asyncrl.core import learner_group as lg
from asyncrl.core.fingerprint import fingerprint
from asyncrl.core import lora as lora_lib
from asyncrl.core.config import LearnerConfig
from asyncrl.core.messages import SentWeights
from asyncrl.core.weights import make_sender, plan_buckets, resolve_backend, tensor_meta, unpack


class WeightSync:
    """The policy's weights as the engines receive them (in the compute dtype; with LoRA the adapted layers, merged)
    and this end of the weight transport (rank 0 only; asyncrl.core.weights.make_sender). `plan` fixes what a sync
    sends once the policy is sharded; the rest but `backend` and `transport` need it."""

    def __init__(self, lcfg: LearnerConfig, device: torch.device, compute_dtype: torch.dtype, model, lora_modules: list[str] | None) -> None:
        self.lcfg, self.device, self.compute_dtype = lcfg, device, compute_dtype
        self.model, self.lora_modules = model, lora_modules
        self.sender = None
        self.sends = 0  # weight versions sent: which rows the fingerprints check (learner.verify_stride)
        self.sync_meta, self.buckets = None, None

    def plan(self) -> None:
        """The names, shapes and dtypes a sync sends, and their send buckets (`learner.sync_bucket_mb`)."""
        self.sync_meta = tensor_meta(self._sync_shapes())
        self.buckets = plan_buckets(self.sync_meta, self.lcfg.sync_bucket_bytes)

    def _sync_shapes(self) -> list[tuple[str, torch.Tensor]]:
        """(checkpoint name, a tensor of the sent shape and dtype) of what a sync sends: every parameter, or with LoRA
        the adapted layers (merged) and their fused siblings. No data is read: the shapes are the global ones."""
        dtype = self.compute_dtype
        if self.lora_modules is None:
            return [(n, torch.empty(p.shape, dtype=dtype, device="meta")) for n, p in self.model.named_parameters()]
        return [(f"{n}.weight", torch.empty(lora_lib.base_weight(self.model, n).shape, dtype=dtype, device="meta")) for n in self.lora_modules]

    def _gathered_buckets(self) -> Iterator[torch.Tensor]:
        """Each send bucket, packed flat in the engines' dtype, gathered from the shards one bucket at a time: the
        extra memory of a sync is a bucket, not a model. A collective: every rank iterates it to the end."""
        full = lambda t: lg.full_tensor(t, self.device)  # noqa: E731
        params = None if self.lora_modules is not None else dict(self.model.named_parameters())
        with torch.no_grad():
            for bucket in self.buckets:
                names = [self.sync_meta[i].name for i in bucket]
                if params is not None:
                    tensors = [full(params[n]) for n in names]
                else:
                    tensors = [lora_lib.merged_weight(self.model, n.removesuffix(".weight"), full) for n in names]
                yield torch.cat([t.to(self.compute_dtype).reshape(-1) for t in tensors])

    def weight_meta(self) -> list[list]:
        return [[m.name, m.dtype, list(m.shape)] for m in self.sync_meta]

    def backend(self) -> str:
        """The torch.distributed backend of the learner's groups: gloo on CPUs, NCCL on GPUs (`learner.backend`)."""
        return resolve_backend(self.lcfg.backend, self.device)

    def transport(self) -> tuple[str, str]:
        """(learner.weight_transport, backend): what an engine needs to build its end of the weight sync."""
        return self.lcfg.weight_transport, self.backend()

    def init_weight_sync(self, host: str, port: int, world_size: int, name: str, listener=None) -> None:
        """(Re)build the weight group `name` (rank 0, hosting its store on `listener`); a version still in flight to
        the old group is abandoned."""
        if self.sender is None:
            self.sender = make_sender(self.lcfg.weight_transport, self.backend())
        self.sender.connect(host, port, world_size, name, listener)

    def send_weights(self, rank: int) -> SentWeights:
        """Gather the weights bucket by bucket and post each to the engines (rank 0), returning without waiting for
        the engines: bytes, seconds and the payload they need to receive them (None for a broadcast; CUDA IPC
        handles). Every rank of the group calls it: the gathers are collectives."""
        t0 = time.monotonic()
        buckets = self._gathered_buckets()
        fingerprints: dict | None = None
        spent = [0.0]
        if rank == 0:
            if self.lcfg.verify_weights:
                fingerprints = {}
                buckets = self._fingerprinted(buckets, fingerprints, spent)
            try:
                sent, payload = self.sender.send(buckets)
            except RuntimeError as exc:  # a receiver died (or was killed, frozen): the broadcast is broken
                for _ in buckets:  # the other ranks' gathers still need this rank: finish them, send nothing
                    pass
                return SentWeights(bytes=0, seconds=time.monotonic() - t0, error=f"{type(exc).__name__}: {exc}"[:500])
        else:
            sent, payload = 0, None
            for _ in buckets:
                pass
        return SentWeights(bytes=sent, seconds=time.monotonic() - t0, payload=payload, fingerprint=fingerprints, fingerprint_s=spent[0])

    def _fingerprinted(self, flats: Iterator[torch.Tensor], into: dict, spent: list[float]) -> Iterator[torch.Tensor]:
        """`flats` as they come, each tensor's fingerprint (asyncrl.core.fingerprint) taken from the bytes sent into
        `into`, while its bucket's broadcast is under way (the sender posts a bucket before it asks for the next);
        a matrix's rows every `learner.verify_stride`-th, from a phase that moves on each sync; `spent[0]` adds up
        the CPU seconds this thread spent on it (its wall time would count the send's own threads, which share the
        learner's core meanwhile)."""
        stride, phase = self.lcfg.verify_stride, self.sends
        self.sends += 1
        for flat, bucket in zip(flats, self.buckets):
            yield flat
            t0 = time.thread_time()
            for name, view in unpack(flat, self.sync_meta, bucket):
                into[name] = fingerprint(view, stride, phase)
            spent[0] += time.thread_time() - t0

    def weights_loaded(self) -> None:
        """Every engine has loaded the version sent last: what was kept for it may go."""
        self.sender.release()

    def gathered_weights(self) -> list[tuple[str, torch.Tensor]]:
        """(checkpoint name, tensor) of exactly what a sync sends the engines, on the CPU, for tests (a collective)."""
        return [(n, t.cpu().clone()) for flat, bucket in zip(self._gathered_buckets(), self.buckets) for n, t in unpack(flat, self.sync_meta, bucket)]
