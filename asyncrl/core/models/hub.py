"""Models by Hugging Face hub id (`model.path=org/name`): downloaded once into the model cache, on the driver, before
Ray starts; other nodes then copy the driver's files as they copy a built-in model (asyncrl.core.models.cache).

A hub id is `org/name` that is not an existing local path and not a built-in name. Where the hub cannot be reached
(no network, HF_HUB_OFFLINE=1) the error says so at once: one metadata request with a short timeout comes before
the download, so a run never spends minutes in retries before failing.
"""
from __future__ import annotations

import re
from pathlib import Path

HUB_TIMEOUT_S = 10.0
"""Seconds the first request to the hub may take before the hub counts as unreachable."""
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
"""What is downloaded: config, weights (safetensors only), tokenizer and chat template; not .bin, ONNX or GGUF copies."""


def is_hub_id(path: str) -> bool:
    """`path` looks like org/name and names nothing on this machine."""
    return bool(HUB_ID.fullmatch(path)) and not Path(path).expanduser().exists()


def hub_dirname(repo_id: str) -> str:
    """The model cache directory of a hub model."""
    return "hub--" + repo_id.replace("/", "--")


def download(repo_id: str, out: Path, timeout_s: float = HUB_TIMEOUT_S) -> None:
    """The hub model's files into `out`; a ValueError naming model.path when the hub cannot be reached or has no
    such model."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        info = HfApi().model_info(repo_id, timeout=timeout_s)
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ValueError(f"model.path={repo_id} is not a local directory, and the Hugging Face hub has no model {repo_id} "
                         f"that this machine may read (private or gated models need HF_TOKEN): {_first_line(exc)}") from None
    except Exception as exc:  # whatever the hub client raises when offline (its HTTP library changes between versions)
        raise ValueError(f"model.path={repo_id} is not a local directory and the Hugging Face hub could not be reached: "
                         f"{_first_line(exc)}") from None
    snapshot_download(repo_id, revision=info.sha, local_dir=out, allow_patterns=MODEL_FILES)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
