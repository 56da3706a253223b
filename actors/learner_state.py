"""The learner's state on disk: checkpoints (sharded, resharded on load), policy snapshots, the exported model."""
from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict

from asyncrl.actors.learner_step import Trainer
from asyncrl.core import lora as lora_lib
from asyncrl.core.config import LoRAConfig
from asyncrl.core.hf_export import ADAPTER_DIR, write_hf_model

CHECKPOINT_DIR = "learner"
"""The sharded learner state inside a run checkpoint (torch.distributed.checkpoint's format)."""


class Checkpoints:
    """Writes and reads back a `Trainer`'s models, optimizers and counters (every method a collective: every rank of
    the learner group calls it), and exports the policy."""

    def __init__(self, trainer: Trainer, model_path: str, compute_dtype: torch.dtype, lora: LoRAConfig, lora_modules: list[str] | None) -> None:
        self.trainer, self.model_path, self.compute_dtype = trainer, model_path, compute_dtype
        self.lora, self.lora_modules = lora, lora_modules

    def _train_state(self) -> dict:
        """The sharded state of every trained model and optimizer (DTensors: each rank holds its shards)."""
        t = self.trainer
        model_sd, optim_sd = get_state_dict(t.model, t.opt)
        state = {"model": model_sd, "optimizer": optim_sd}
        if t.critic is not None:
            state["critic"], state["critic_optimizer"] = get_state_dict(t.critic, t.critic_opt)
        return state

    def save_checkpoint(self, directory: str) -> str:
        """learner/ (torch.distributed.checkpoint: every rank writes its shards) and learner-rank<R>.pt (counters and
        RNG). Every rank calls it with the same directory (on storage every rank's node reaches)."""
        t = self.trainer
        path = f"{directory}/{CHECKPOINT_DIR}"
        dcp.save(self._train_state(), checkpoint_id=path)
        counters = {"steps_done": t.steps_done, "skipped_steps": t.skipped_steps, "torch_rng": torch.get_rng_state(),
                    "world": t.dp.world, "critic": t.critic is not None}
        torch.save(counters, f"{directory}/learner-rank{t.dp.rank}.pt")
        return path

    def load_checkpoint(self, directory: str) -> int:
        """Continue from a checkpoint written at any learner world size (DCP reshards); the reference policy stays
        the run's initial model. Returns steps done."""
        t = self.trainer
        if not os.path.isdir(f"{directory}/{CHECKPOINT_DIR}"):
            raise ValueError(f"{directory} has no {CHECKPOINT_DIR}/: not a learner checkpoint of this version of asyncrl")
        own = f"{directory}/learner-rank{t.dp.rank}.pt"
        counters = torch.load(own if os.path.isfile(own) else f"{directory}/learner-rank0.pt", weights_only=True)
        if t.critic is not None and not counters["critic"]:
            raise ValueError(f"{directory} has no critic: it was written by a run without one")
        state = self._train_state()
        dcp.load(state, checkpoint_id=f"{directory}/{CHECKPOINT_DIR}")
        set_state_dict(t.model, t.opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        if t.critic is not None:
            set_state_dict(t.critic, t.critic_opt, model_state_dict=state["critic"], optim_state_dict=state["critic_optimizer"])
        t.steps_done, t.skipped_steps = counters["steps_done"], counters["skipped_steps"]
        torch.set_rng_state(counters["torch_rng"].cpu())
        return t.steps_done

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's whole state dict on rank 0's CPU, gathered one tensor at a time (other ranks: {}). With LoRA
        the peft model's keys (adapter and base)."""
        return get_model_state_dict(self.trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def _plain_state_dict(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """An ordinary Hugging Face state dict of the policy (with LoRA: the adapter merged into its layers)."""
        if self.lora_modules is None:
            return full
        return lora_lib.merge_state_dict(full, self.lora.alpha / self.lora.rank)

    def save_policy(self, path: str) -> str:
        """The policy's state_dict alone (a snapshot for offline evaluation), written atomically by rank 0."""
        plain = self._plain_state_dict(self.full_state_dict())
        if self.trainer.dp.rank == 0:
            tmp = f"{path}.tmp"
            torch.save(plain, tmp)
            os.replace(tmp, path)
        return path

    def save(self, path: str, tokenizer_from: str) -> str:
        """The policy as a Hugging Face directory (`from_pretrained` reads it; the final model, a checkpoint's hf/), in
        model.dtype, and with LoRA the adapter alone too, as a peft adapter in `path`/adapter. Written by rank 0
        (asyncrl.core.hf_export, as `python -m asyncrl.export` writes one)."""
        full = self.full_state_dict()
        if self.trainer.dp.rank != 0:
            return path
        write_hf_model(path, self.model_path, self._plain_state_dict(full), self.compute_dtype, tokenizer_from)
        if self.lora_modules is not None:
            lora_lib.save_adapter(self.trainer.model, full, f"{path}/{ADAPTER_DIR}")
        return path
