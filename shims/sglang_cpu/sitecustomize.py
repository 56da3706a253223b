"""Start-up hook of every Python process of an SGLang rollout actor: this folder is on their PYTHONPATH
(actors/sglang_engine.py sets it through the actor's runtime_env; SGLang's scheduler and detokenizer are spawned
with the same environment). Nothing here runs in a vLLM actor, the learner or the driver.

- `fallback/` goes at the END of `sys.path`: `import sgl_kernel` finds an installed kernel package first, and only
  on machines without one (these CPUs: `sglang-kernel-cpu` is not on PyPI) the pure-PyTorch ops in
  fallback/sgl_kernel.
- torchvision (SGLang imports `torchvision.transforms` at start-up, for multimodal configs): PyPI's wheel carries a
  compiled extension that does not load next to the CPU build of torch, and its `_meta_registrations` then fails on
  the missing `torchvision::nms`. That module only registers fake kernels for those compiled ops, so an empty one
  stands in for it: `torchvision.transforms` works, `torchvision.ops` (nms, roi_align) does not; text models never
  call them.
"""
import os
import sys
import types

_FALLBACK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fallback")
if _FALLBACK not in sys.path:
    sys.path.append(_FALLBACK)

if "torchvision._meta_registrations" not in sys.modules:
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
