"""Which engine a rollout actor runs (rollout.engine), and what its actor needs: one place for both engines.

`actors/engine.py` (vLLM) and `actors/sglang_engine.py` (SGLang) have the same methods; SGLang is imported only
when chosen, since it lives next to the environment (`make sglang`), not in it.
"""
from __future__ import annotations

from actors.engine import VLLMEngine


def make_engine(engine: str, model_path: str, dtype: str, max_model_len: int, seed: int, kv_cache_gib: float, gpu_mem: float,
                priority: bool = False, stop_strings: bool = False):
    """The engine `rollout.engine` names, with the same methods either way. `priority`: requests are scheduled by
    the priority `add` gives them, lower values first; `stop_strings`: requests may stop at strings (SGLang then
    starts its detokenizer, which stop strings need)."""
    if engine == "sglang":
        from actors.sglang_engine import SGLangEngine

        return SGLangEngine(model_path, dtype, max_model_len, seed, kv_cache_gib, gpu_mem, priority, stop_strings)
    if engine == "vllm":
        return VLLMEngine(model_path, dtype, max_model_len, seed, kv_cache_gib, gpu_mem, priority)
    raise ValueError(f"rollout.engine={engine!r}: expected vllm or sglang")


def engine_runtime_env(engine: str, on_gpu: bool) -> dict:
    """What a rollout actor of `engine` adds to the job's runtime_env (SGLang: its own PYTHONPATH)."""
    if engine == "sglang":
        from actors.sglang_engine import sglang_env

        return {"env_vars": sglang_env(on_gpu)}
    return {}
