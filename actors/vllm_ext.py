"""The receiving end of the weight broadcast, mixed into vLLM's worker.

Passed to vLLM as ``worker_extension_cls="actors.vllm_ext.WeightSyncExtension"``
and called through ``collective_rpc``; arguments are plain lists so that the
same calls work when the worker lives in another process (GPU, AsyncLLM).
"""
from __future__ import annotations

import torch

from asyncrl.weights import TensorMeta, WeightReceiver, init_group, open_weights_ipc, plan_buckets


class WeightSyncExtension:
    def asyncrl_init_weight_sync(
        self, host: str, port: int, rank: int, world_size: int, backend: str, meta: list, bucket_bytes: int
    ) -> bool:
        self._asyncrl_meta = [TensorMeta(n, d, tuple(s)) for n, d, s in meta]
        self._asyncrl_buckets = plan_buckets(self._asyncrl_meta, bucket_bytes)
        if backend != "cuda_ipc":  # IPC needs no group: handles come with each update
            group = init_group(host, port, rank, world_size, backend)
            device = torch.device(self.device) if isinstance(self.device, str) else self.device  # type: ignore[attr-defined]
            self._asyncrl_receiver = WeightReceiver(group, self._asyncrl_meta, self._asyncrl_buckets, device)
        return True

    def asyncrl_receive_weights_ipc(self, handles: list) -> int:
        """Colocated on the learner's GPU: map the learner's buckets and load them (no copy on the wire)."""
        weights = list(open_weights_ipc(handles, self._asyncrl_meta, self._asyncrl_buckets, torch.cuda.current_device()))
        self.model_runner.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]
        return sum(t.numel() * t.element_size() for _, t in weights)

    def asyncrl_receive_weights(self) -> int:
        """Receive every bucket of the next version, then load the lot in one `reload_weights` call; returns bytes."""
        self.model_runner.reload_weights(weights_iterator=self._asyncrl_receiver.receive())  # type: ignore[attr-defined]
        return self._asyncrl_receiver.nbytes
