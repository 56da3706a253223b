"""The SGLang engine's environment: the CPU fallback op computed by hand, the fallback never shadowing an installed
kernel package, the runtime_env an SGLang actor gets, and the error when SGLang was never installed (fast; the
engine itself runs in tests/test_e2e.py, test_weight_update.py and test_weight_sync.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.actors import sglang_engine
from asyncrl.actors.engines import engine_runtime_env

ROOT = Path(__file__).resolve().parents[1]
SHIMS = ROOT / "shims" / "sglang_cpu"


def python(code: str, pythonpath: list[Path]) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_fallback_assign_req_to_token_pool_by_hand():
    """Two requests in pool rows 2 and 0: row 2 gets slots 10, 11 at columns 1..2, row 0 gets 12, 13, 14 at 0..2."""
    code = """
import torch, sgl_kernel
req_to_token = torch.full((3, 5), -1, dtype=torch.int32)
sgl_kernel.assign_req_to_token_pool_cpu(torch.tensor([2, 0]), req_to_token, torch.tensor([1, 0]), torch.tensor([3, 3]),
                                        torch.tensor([10, 11, 12, 13, 14]), 5)
print(req_to_token.tolist(), sgl_kernel.FALLBACK, torch.ops.sgl_kernel.assign_req_to_token_pool_cpu is not None)
"""
    out = python(code, [SHIMS])  # sitecustomize puts fallback/ at the end of sys.path
    assert out == str([[12, 13, 14, -1, -1], [-1, -1, -1, -1, -1], [-1, 10, 11, -1, -1]]) + " True True"


def test_fallback_names_a_missing_op_when_called():
    code = """
import sgl_kernel
try:
    sgl_kernel.some_fused_moe_cpu(1)
except NotImplementedError as exc:
    print(exc)
"""
    out = python(code, [SHIMS])
    assert "sgl_kernel.some_fused_moe_cpu" in out and "sglang-kernel-cpu" in out


def test_an_installed_kernel_package_wins_over_the_fallback(tmp_path):
    real = tmp_path / "site" / "sgl_kernel"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    out = python("import sgl_kernel; print(getattr(sgl_kernel, 'REAL', False), hasattr(sgl_kernel, 'FALLBACK'))", [SHIMS, tmp_path / "site"])
    assert out == "True False"


def test_sglang_actor_environment():
    env = engine_runtime_env("sglang", on_gpu=False)["env_vars"]
    path = env["PYTHONPATH"].split(os.pathsep)
    assert path[:2] == [str(Path(sys.prefix) / "sglang"), str(SHIMS)]
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert "SGLANG_USE_CPU_ENGINE" not in engine_runtime_env("sglang", on_gpu=True)["env_vars"]
    assert engine_runtime_env("vllm", on_gpu=False) == {}


def test_missing_sglang_is_named_with_the_command(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"make sglang"):
        sglang_engine.check_installed()


def test_kv_tokens_fill_the_configured_cache(random_model_dir):
    """The tiny model: 3 layers x 2 (K, V) x its KV heads x head size 64 x 4 bytes per token."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(random_model_dir)
    per_token = 2 * c.num_hidden_layers * (c.num_key_value_heads or c.num_attention_heads) * 64 * torch.float32.itemsize
    assert sglang_engine.kv_tokens(random_model_dir, "float32", 0.5) == 2**29 // per_token
