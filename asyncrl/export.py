"""A run's checkpoint as a Hugging Face model directory: `python -m asyncrl.export RUN_DIR [--step N] [--out DIR]`.

A checkpoint holds the learner's sharded state (torch.distributed.checkpoint), which only a learner can load. This
reads the policy's tensors from those shards on one process, without Ray or a process group, and writes what the
final model is written as (asyncrl.core.hf_export): config, safetensors in model.dtype, generation config and
tokenizer, and with LoRA the merged model plus the adapter alone in adapter/. The model's architecture and
tokenizer come from the run's config.yaml (`model.path`, resolved as the run resolved it). Default: the latest
checkpoint, into RUN_DIR/exports/step-NNNNNN.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from pydantic import ValidationError

from asyncrl.core.checkpoint import checkpoints_dir, complete_checkpoints, latest_checkpoint
from asyncrl.core.config import LoRAConfig, ModelConfig

POLICY_KEY = "model"
"""The policy's entry in the learner's checkpoint state (asyncrl.actors.learner_state `Checkpoints._train_state`)."""
EXPORTS = "exports"
"""Where exports go inside the run directory by default."""


@dataclass(frozen=True)
class RunModel:
    """What an export needs of a run's config.yaml: the model, its dtype and the LoRA settings. Read alone, not as a
    whole Config, so that a run whose other keys have changed since still exports."""
    model: ModelConfig
    digits: int  # task.digits and run.seed: which build of the built-in tiny model
    seed: int
    lora: LoRAConfig

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32 if self.model.dtype == "auto" else getattr(torch, self.model.dtype)


def read_run_model(config_yaml: Path) -> RunModel:
    raw = yaml.safe_load(config_yaml.read_text()) or {}
    try:
        return RunModel(model=ModelConfig(**raw.get("model", {})), digits=raw.get("task", {}).get("digits", 2),
                        seed=raw.get("run", {}).get("seed", 0), lora=LoRAConfig(**raw.get("learner", {}).get("lora", {})))
    except ValidationError as exc:
        raise ValueError(f"{config_yaml}: the model or learner.lora settings do not load: {exc.errors()[0]['msg']}") from None


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """The checkpoint continuing at `step` (None: the latest); a ValueError saying what is missing otherwise."""
    if not (run_dir / "config.yaml").is_file():
        raise ValueError(f"{run_dir} is not an asyncrl run directory (no config.yaml)")
    found = complete_checkpoints(run_dir)
    if not found:
        raise ValueError(f"{run_dir} has no checkpoint in {checkpoints_dir(run_dir)} (run.checkpoint_every was 0, or the run stopped before its first)")
    if step is None:
        return latest_checkpoint(run_dir)
    if step not in found:
        raise ValueError(f"{run_dir} has no checkpoint at step {step}; its checkpoints are at steps {', '.join(map(str, found))}")
    return found[step]


def read_policy_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The policy's whole state dict (fp32, as the learner keeps it) from a checkpoint's shards, on this process alone;
    the keys are the learner model's (with LoRA, the peft model's)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from asyncrl.actors.learner import CHECKPOINT_DIR

    shards = checkpoint / CHECKPOINT_DIR
    if not shards.is_dir():
        raise ValueError(f"{checkpoint} has no {CHECKPOINT_DIR}/: not a learner checkpoint of this version of asyncrl")
    reader = dcp.FileSystemReader(str(shards))
    prefix = f"{POLICY_KEY}."
    state = {key.removeprefix(prefix): torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in reader.read_metadata().state_dict_metadata.items()
             if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({POLICY_KEY: state}, storage_reader=reader, no_dist=True)
    return state


def write_export(run: RunModel, full: dict[str, torch.Tensor], out: Path) -> Path:
    """The policy of `run` (its learner's state dict `full`) as a model directory at `out`, written into a sibling
    temporary directory renamed into place."""
    from asyncrl.core import lora as lora_lib
    from asyncrl.core.hf_export import ADAPTER_DIR, meta_peft_model, write_hf_model
    from asyncrl.core.models import resolve_model_path
    from asyncrl.core.models.cache import cache_dir

    source = str(resolve_model_path(run.model.path, run.digits, run.seed, cache_dir(run.model.cache_dir)))
    lora = run.lora
    plain = lora_lib.merge_state_dict(full, lora.alpha / lora.rank) if lora.rank > 0 else full
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    write_hf_model(tmp, source, plain, run.dtype, source)
    if lora.rank > 0:
        peft_model = meta_peft_model(source, lora.rank, lora.alpha, list(lora.target_modules), lora.top_layers)
        lora_lib.save_adapter(peft_model, full, str(tmp / ADAPTER_DIR))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def export_checkpoint(run_dir: str | Path, step: int | None = None, out: str | Path | None = None) -> Path:
    """Export the checkpoint continuing at `step` (None: the latest) of `run_dir` into `out` (None:
    RUN_DIR/exports/step-NNNNNN); returns the directory written."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} is not a directory")
    checkpoint = find_checkpoint(run_dir, step)
    run = read_run_model(run_dir / "config.yaml")
    dest = Path(out) if out is not None else run_dir / EXPORTS / checkpoint.name
    return write_export(run, read_policy_state(checkpoint), dest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncrl.export",
                                     description="Write a run's checkpoint as a Hugging Face model directory (no Ray, one process).")
    parser.add_argument("run_dir", type=Path, help="the run's output_dir (config.yaml, checkpoints/)")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the latest)")
    parser.add_argument("--out", type=Path, default=None, help="where to write it (default: RUN_DIR/exports/step-NNNNNN)")
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(args.run_dir, args.step, args.out)
    except ValueError as err:
        print(f"asyncrl.export: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
