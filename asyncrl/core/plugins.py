"""Loading a user's object (a reward, an environment, an agent, an algorithm) by its dotted path."""
from __future__ import annotations

import importlib


def load_object(dotted: str) -> object:
    """Import ``pkg.module.attr``; raise ValueError naming the path when it cannot."""
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"{dotted!r} is not a dotted path (expected pkg.module.name)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for {dotted!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)
