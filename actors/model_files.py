"""Serves the driver node's copy of a built-in model to nodes whose cache lacks it (asyncrl.core.models.cache)."""
from __future__ import annotations

from pathlib import Path

from asyncrl.core.models.cache import read_chunk


class ModelFiles:
    """A Ray actor pinned to the driver's node; lives only while the pools' nodes get their copies."""

    def __init__(self, model_dir: str) -> None:
        self.root = Path(model_dir)

    def read(self, rel: str, offset: int, size: int) -> bytes:
        return read_chunk(self.root, rel, offset, size)
