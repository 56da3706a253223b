"""Which engine a rollout actor runs (rollout.engine), and what its actor needs: one place for both engines.

`actors/engine.py` (vLLM) and `actors/sglang_engine.py` (SGLang) have the same methods; SGLang is imported only
when chosen, since it lives next to the environment (`make sglang`), not in it.
"""
from __future__ import annotations

from asyncrl.actors.engine import VLLMEngine


def make_engine(engine: str, model_path: str, dtype: str, max_model_len: int, seed: int, kv_cache_gib: float, gpu_mem: float,
                priority: bool = False, stop_strings: bool = False, tensor_parallel_size: int = 1, cuda_graphs: bool = True):
    """The engine `rollout.engine` names, with the same methods either way. `priority`: requests are scheduled by
    the priority `add` gives them, lower values first; `stop_strings`: requests may stop at strings (SGLang then
    starts its detokenizer, which stop strings need). On a GPU only (untested: docs/engines-gpu.md): `gpu_mem`
    (rollout.gpu_memory_utilization), `tensor_parallel_size` and `cuda_graphs`; on the CPU an engine is eager with
    one rank (`actors.engine.vllm_engine_args`, `actors.sglang_engine.sglang_engine_args`)."""
    if engine == "sglang":
        from asyncrl.actors.sglang_engine import SGLangEngine

        return SGLangEngine(model_path, dtype, max_model_len, seed, kv_cache_gib, gpu_mem, priority, stop_strings,
                            tensor_parallel_size=tensor_parallel_size, cuda_graphs=cuda_graphs)
    if engine == "vllm":
        return VLLMEngine(model_path, dtype, max_model_len, seed, kv_cache_gib, gpu_mem, priority,
                          tensor_parallel_size=tensor_parallel_size, cuda_graphs=cuda_graphs)
    raise ValueError(f"rollout.engine={engine!r}: expected vllm or sglang")


def engine_runtime_env(engine: str, on_gpu: bool) -> dict:
    """What a rollout actor of `engine` adds to the job's runtime_env (SGLang: its own PYTHONPATH)."""
    if engine == "sglang":
        from asyncrl.actors.sglang_engine import sglang_env

        return {"env_vars": sglang_env(on_gpu)}
    return {}
