"""Where models live on a node, and how a built-in model reaches a node that lacks it.

The cache is per user, not per working directory (`~/.cache/asyncrl/models` unless told otherwise), so a job
submitted with `ray job submit --working-dir .`, which runs in a fresh directory each time, finds the model the
last job built. A built-in model (`tiny`, `smollm2-135m-instruct`) is built once on the driver's node; a node
whose own cache lacks it copies the driver's files, byte for byte (`fetch_into`), so every actor starts from
identical weights even where the nodes share no disk. A local model directory is the user's: it is not copied,
and a node that lacks it is an error naming the node and the path.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CACHE_ENV = "ASYNCRL_CACHE_DIR"
"""Overrides the default model cache (model.cache_dir, when set, overrides both)."""
CHUNK_BYTES = 64 << 20
"""Bytes per read when a node copies a model from the driver's node."""


def cache_dir(configured: str = "") -> Path:
    """The model cache on this node: `model.cache_dir` when set (~ expanded), else $ASYNCRL_CACHE_DIR, else
    $XDG_CACHE_HOME/asyncrl/models, else ~/.cache/asyncrl/models. Always absolute."""
    if configured:
        return Path(configured).expanduser().resolve()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().resolve()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (base / "asyncrl" / "models").expanduser().resolve()


def cached_build(out_dir: Path, build: Callable[[Path], object], doing: str = "building") -> Path:
    """`build(dir)` under a file lock unless already present, so concurrent callers build once; it writes into
    a sibling temporary directory that is renamed into place, so an interrupted build leaves nothing behind."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out_dir / "config.json").is_file():
            print(f"asyncrl: {doing} {out_dir.name} into {out_dir.parent} (once: later runs reuse it)", flush=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
            try:
                build(tmp)
                tmp.chmod(0o755)
                shutil.rmtree(out_dir, ignore_errors=True)  # a half-written directory from before this scheme
                os.replace(tmp, out_dir)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def manifest(model_dir: Path) -> dict[str, int]:
    """Every file of a model directory (relative path -> size in bytes)."""
    return {str(p.relative_to(model_dir)): p.stat().st_size for p in sorted(model_dir.rglob("*")) if p.is_file()}


def fetch_into(out_dir: Path, files: dict[str, int], read: Callable[[str, int, int], bytes], chunk: int = CHUNK_BYTES) -> None:
    """Write every file of `files` into `out_dir` from `read(relative_path, offset, size) -> bytes`, in chunks;
    raises OSError when a file comes back shorter or longer than its manifest says."""
    for rel, size in files.items():
        dest = out_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as f:
            for offset in range(0, size, chunk):
                f.write(read(rel, offset, min(chunk, size - offset)))
        if dest.stat().st_size != size:
            raise OSError(f"copying the model: {rel} arrived with {dest.stat().st_size} bytes, expected {size}")


def read_chunk(root: Path, rel: str, offset: int, size: int) -> bytes:
    """`size` bytes of `root/rel` from `offset`; refuses a path that leaves `root`."""
    path = (root / rel).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f"{rel!r} is not inside the model directory {root}")
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


@dataclass(frozen=True)
class ModelSource:
    """The model as the driver resolved it: what each actor needs to find or fetch it on its own node."""
    given: str  # model.path as the user wrote it
    path: str  # its directory on the driver's node (absolute)
    builtin: str = ""  # a built-in's cache directory name ("" for a local model directory)
    files: tuple[tuple[str, int], ...] = ()  # a built-in's manifest, to fetch and check it elsewhere
    cache: str = ""  # model.cache_dir as configured ("" for the default, resolved on each node)


def model_on_this_node(source: ModelSource, read: Callable[[str, int, int], bytes] | None) -> str:
    """The model's directory on this node, which is not the driver's: a local model directory where the driver has
    it (or a ValueError naming this node); a built-in from this node's own cache, copied there from the driver's
    node through `read` when missing or different (once, under a lock). Where the cache is on a disk the nodes
    share, the driver's copy is already there and nothing is read."""
    files = dict(source.files)
    if not source.builtin:
        if (Path(source.path) / "config.json").is_file():
            return source.path
        raise ValueError(f"model.path {source.given!r}: {source.path} does not exist on node {socket.gethostname()} "
                         f"({node_ip()}); a local model directory must be on every node that runs an actor (or on shared storage)")
    local = cache_dir(source.cache) / source.builtin
    if local.is_dir() and manifest(local) == files:
        return str(local)
    if read is None:
        raise ValueError(f"model.path {source.given!r}: not in this node's cache ({cache_dir(source.cache)}) "
                         f"on {socket.gethostname()} ({node_ip()}), and no copy from the driver's node was offered")
    if local.exists():  # a different build under the same name: replace it
        shutil.rmtree(local)
    doing = f"copying from the driver's node to {socket.gethostname()} ({node_ip()}):"
    return str(cached_build(local, lambda tmp: fetch_into(tmp, files, read), doing))


def node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray
        return "no Ray node"
