"""Pure-PyTorch stand-ins for the CPU ops of SGLang's kernel package that SGLang's CPU engine calls on these machines.

The CPU build of `sgl_kernel` (`sglang-kernel-cpu`) is not published on PyPI, and SGLang's CPU engine imports one of
its ops on every batch, whatever the attention backend. This package is test infrastructure for machines without
that build: each op is registered with `torch.library` under the real op's name (`sgl_kernel::<op>`) and exposed
under the real Python name. It sits at the END of `sys.path` (see ../../sitecustomize.py), so an installed
`sgl_kernel` is always imported instead of it. The ops, one by one (docs/engines.md, "SGLang on the CPU"):

- `assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
  pool_len)`: for each request i of the batch, write its new KV slots `out_cache_loc[sum(len_<i) : sum(len_<=i)]`
  into row `req_pool_indices[i]` of `req_to_token`, columns `start_offset[i] : end_offset[i]` (len_i =
  end_offset[i] - start_offset[i]). Same arguments as sgl-kernel's `csrc/cpu` op; `pool_len` is the row length.

Any other name raises NotImplementedError naming the op when it is called, so a missing op is never silent.
"""
from __future__ import annotations

import torch

FALLBACK = True
"""Marks this package as the fallback (an installed sgl_kernel has no such attribute)."""

_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")
_LIB.define(
    "assign_req_to_token_pool_cpu(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
    "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()"
)


def _assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, start_offset: torch.Tensor,
    end_offset: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int,
) -> None:
    lengths = (end_offset - start_offset).tolist()
    starts, rows = start_offset.tolist(), req_pool_indices.tolist()
    pos = 0
    for row, start, n in zip(rows, starts, lengths):
        if start + n > pool_len:
            raise ValueError(f"assign_req_to_token_pool_cpu: offsets {start}..{start + n} exceed the pool row ({pool_len})")
        req_to_token[row, start : start + n] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


_LIB.impl("assign_req_to_token_pool_cpu", _assign_req_to_token_pool_cpu, "CPU")


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    torch.ops.sgl_kernel.assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: this machine has only asyncrl's pure-PyTorch fallback for SGLang's CPU kernels "
            f"(shims/sglang_cpu/fallback), which does not implement {name}; install sglang-kernel-cpu"
        )

    missing.__name__ = name
    return missing
