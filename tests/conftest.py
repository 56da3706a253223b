"""Shared fixtures: a random tiny model (fast), the warm-started tiny model and SmolLM2 (cached), and a Ray cluster."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> str:
    """An untrained tiny Qwen2 in HF format (seconds to build)."""
    from asyncrl.core.models.tiny import TinySpec, build_model, build_tokenizer, save_tokenizer

    out = tmp_path_factory.mktemp("random_model")
    tokenizer = build_tokenizer()
    build_model(TinySpec(), len(tokenizer)).save_pretrained(out)
    save_tokenizer(tokenizer, out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The warm-started tiny model, built once into the model cache (as `make run` does)."""
    from asyncrl.core.models import resolve_model_path
    from asyncrl.core.models.cache import cache_dir

    return str(resolve_model_path("tiny", digits=2, seed=0, cache_dir=cache_dir()))


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct converted from its PyPI wheel into the repo cache (once, about a minute), as
    `model.path=smollm2-135m-instruct` does."""
    from asyncrl.core.models import resolve_model_path
    from asyncrl.core.models.cache import cache_dir

    return str(resolve_model_path("smollm2-135m-instruct", digits=2, seed=0, cache_dir=cache_dir()))


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from asyncrl.orchestration.cluster import ACTOR_ENV

    ray.init(num_cpus=2, runtime_env={"env_vars": ACTOR_ENV}, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """In-process learners set torch's thread count; an in-process vLLM engine built later in the same
    pytest process must see the count it started with (its CPU attention checks it)."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
