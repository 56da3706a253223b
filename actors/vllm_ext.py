"""The receiving end of the weight broadcast, mixed into vLLM's worker.

Passed to vLLM as ``worker_extension_cls="asyncrl.actors.vllm_ext.WeightSyncExtension"``
and called through ``collective_rpc``; arguments are plain lists so that the
same calls work when the worker lives in another process (GPU, AsyncLLM).

Loading: vLLM's `reload_weights` is the documented way to replace weights
after start-up (plain `load_weights` breaks on the CPU backend, whose linear
layers are repacked at load time). It sets up and tears down its layerwise
machinery on every module of the model, whatever was sent. `reload_units` runs
the same vLLM machinery (`initialize_layerwise_reload`, the model's own
`load_weights`, `finalize_layerwise_reload`) on the smallest modules that hold
the tensors sent, so a sync of 8 of 30 layers (LoRA `top_layers`) pays for 8:
bench/weight_load.py measures both on the same tensors and checks that they
leave identical weights.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from asyncrl.core.fingerprint import fingerprint, locate, probe_vector
from asyncrl.core.weights import TensorMeta, make_receiver, plan_buckets


def load_units(module_names: set[str], weight_names: Iterable[str]) -> list[str]:
    """The modules a reload of `weight_names` (checkpoint names) must set up: for each weight, the deepest module of
    `module_names` that is a prefix of its name (checkpoint q/k/v land in vLLM's fused `qkv_proj`, so the unit of
    `...self_attn.q_proj.weight` is `...self_attn`), without the ones inside another unit. "" is the whole model."""
    units = set()
    for name in weight_names:
        parts = name.split(".")[:-1]
        while parts and ".".join(parts) not in module_names:
            parts.pop()
        units.add(".".join(parts))
    if "" in units:
        return [""]
    return sorted(u for u in units if not any(u.startswith(f"{v}.") for v in units if v != u))


def served_fingerprints(model, meta: list[TensorMeta], dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
    """The fingerprint (asyncrl.core.fingerprint) of every checkpoint tensor of `meta` as `model` serves it now. A
    linear layer's weight is probed through the layer's own kernel (`quant_method.apply` on the probe vector, no bias:
    the CPU backend keeps its weights repacked, out of reach), split at the fused parts' rows; any other tensor
    (norms, biases, an embedding's rows) is read. A tensor no module serves is left out (a mismatch)."""
    modules = dict(model.named_modules())
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    probed: dict[str, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for m in meta:
            try:
                path, leaf, offset, rows = locate(modules, packed, m.name)
            except KeyError:
                continue
            module, rows = modules[path], rows if rows is not None else m.shape[0]
            apply = getattr(getattr(module, "quant_method", None), "apply", None)
            if leaf == "weight" and len(m.shape) == 2 and apply is not None:
                if path not in probed:
                    x = probe_vector(m.shape[1], dtype, device).reshape(1, -1)
                    probed[path] = apply(module, x).reshape(-1).float().cpu()
                out[m.name] = probed[path][offset : offset + rows].clone()
            else:
                out[m.name] = fingerprint(getattr(module, leaf)[offset : offset + rows])
    return out


def reload_units(model_runner, weights: list[tuple[str, torch.Tensor]], units: list[str]) -> None:
    """vLLM's in-place reload (`reload_weights`) restricted to `units` (see `load_units`): the layerwise set-up and
    finalisation run on those modules only, then the same resets `GPUModelRunner.reload_weights` does."""
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload, initialize_layerwise_reload

    model = model_runner.get_model()
    modules = [model.get_submodule(u) if u else model for u in units]
    for m in modules:
        initialize_layerwise_reload(m)
    try:
        model.load_weights(weights)
    finally:
        for m in modules:
            finalize_layerwise_reload(m, model_runner.vllm_config.model_config)
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
        getattr(model_runner, reset, lambda: None)()


class WeightSyncExtension:
    def asyncrl_init_weight_sync(
        self, host: str, port: int, rank: int, world_size: int, transport: list, meta: list, bucket_bytes: int, name: str
    ) -> bool:
        """Build this worker's end of the weight transport (`transport`: [learner.weight_transport, backend]). `rank` is
        the engine's first rank in the weight group; each tensor-parallel worker joins at `rank` + its rank within the
        engine (torch.distributed's, which vLLM initialises for its workers: 0 with one worker), as SGLang's
        `rank_offset` does."""
        self._asyncrl_meta = [TensorMeta(n, d, tuple(s)) for n, d, s in meta]
        self._asyncrl_buckets = plan_buckets(self._asyncrl_meta, bucket_bytes)
        self._asyncrl_units = self._asyncrl_load_units([m.name for m in self._asyncrl_meta])
        device = torch.device(self.device) if isinstance(self.device, str) else self.device  # type: ignore[attr-defined]
        self._asyncrl_receiver = make_receiver(*transport, self._asyncrl_meta, self._asyncrl_buckets, device)
        tp_rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self._asyncrl_receiver.connect(host, port, rank + tp_rank, world_size, name)
        return True

    def asyncrl_receive_weights(self, payload=None) -> int:
        """Receive the next version (from the group, or from the payload the learner's end made), then load it in
        one reload; returns bytes."""
        reload_units(self.model_runner, self._asyncrl_receiver.receive(payload), self._asyncrl_units)  # type: ignore[attr-defined]
        return self._asyncrl_receiver.nbytes

    def asyncrl_fingerprint(self) -> dict[str, torch.Tensor] | None:
        """The fingerprints of the weights this worker serves, for every tensor a sync sends (`served_fingerprints`);
        None before this worker joined a weight sync (it knows no sync's tensors)."""
        if getattr(self, "_asyncrl_meta", None) is None:
            return None
        runner = self.model_runner  # type: ignore[attr-defined]
        return served_fingerprints(runner.get_model(), self._asyncrl_meta, runner.vllm_config.model_config.dtype, self.device)  # type: ignore[attr-defined]

    def asyncrl_load_weights(self, weights: list[tuple[str, torch.Tensor]], scoped: bool = True) -> None:
        """Load checkpoint-named tensors given in-process (offline evaluation, bench/weight_load.py): `reload_units`
        on their modules, or (scoped=False) vLLM's whole-model `reload_weights`."""
        if not scoped:
            self.model_runner.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]
            return
        reload_units(self.model_runner, weights, self._asyncrl_load_units([n for n, _ in weights]))  # type: ignore[attr-defined]

    def _asyncrl_load_units(self, weight_names: list[str]) -> list[str]:
        """`load_units` over this worker's model."""
        names = {n for n, _ in self.model_runner.get_model().named_modules()}  # type: ignore[attr-defined]
        return load_units(names, weight_names)
