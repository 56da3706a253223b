"""Learner: the HF policy in torch, one algorithm step per batch, weight publishing.

The learner knows no algorithm by name: advantages and the losses come from
the plugin `algorithm.name` resolves to; a plugin with `critic = True` gets a
value model trained next to the policy. The actor loads the models and shards
them over its group; the rest is its parts':

    actors/learner_step.py    Trainer: the training step (collate, the passes without gradient,
                              advantages, mini-batch updates over micro-batches, metrics)
    actors/learner_sync.py    WeightSync: what a sync sends the engines, and the sender
    actors/learner_state.py   Checkpoints: checkpoints, policy snapshots, the exported model
"""
from __future__ import annotations

import copy

import torch
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from asyncrl.algorithms import get_algorithm
from asyncrl.algorithms.base import has_critic
from asyncrl.core.config import Config
from asyncrl.core.messages import SentWeights
from asyncrl.core import learner_group as lg
from asyncrl.core import memory as mem
from asyncrl.core.sharding import shard_model
from asyncrl.core.models.value import ValueModel
from asyncrl.core.util import pin_to_cores
from asyncrl.core import lora as lora_lib
from asyncrl.core.weights import listen_socket
from asyncrl.actors.learner_state import CHECKPOINT_DIR, Checkpoints  # noqa: F401 - CHECKPOINT_DIR: asyncrl.export reads it here
from asyncrl.actors.learner_step import Trainer, reference_kept
from asyncrl.actors.learner_sync import WeightSync


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Learner:
    """One rank of the learner group (`asyncrl.core.learner_group`): its FSDP2 shard of the policy, the critic and the
    reference. Models are loaded in fp32 (the master weights) and sharded when the group is joined
    (`init_learner_group`; world 1 joins a one-process group at first use): then its `trainer` and `checkpoints` exist."""

    def __init__(self, cfg: Config, model_path: str, rank: int = 0) -> None:
        cores = cfg.learner.cpu_affinity
        pin_to_cores([cores[rank % len(cores)]] if cores and cfg.learner.num_workers > 1 else cores)
        torch.set_num_threads(cfg.learner.torch_threads)
        torch.manual_seed(cfg.run.seed)
        self.cfg, self.device, self.model_path = cfg, _device(cfg.learner.device), model_path
        self.compute_dtype = getattr(torch, cfg.model.dtype)  # forward and backward; the master weights are fp32
        lcfg, lora = cfg.learner, cfg.learner.lora
        self.memory = _check_memory(cfg, model_path, rank, self.device, self.compute_dtype)  # before any weight is loaded
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if lcfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora_modules: list[str] | None = None  # LoRA: the checkpoint modules a weight sync sends, merged
        self.ref_model = None  # the frozen reference: none when nothing reads it, the adapter off with LoRA
        if lora.rank > 0:
            self.model = lora_lib.wrap(self.model, lora.rank, lora.alpha, lora.target_modules, lora.top_layers)
            self.lora_modules = lora_lib.sync_modules(self.model)
        elif reference_kept(cfg.algorithm):
            self.ref_model = copy.deepcopy(self.model).to(self.compute_dtype).eval().requires_grad_(False)
        self.model.train()
        self.algo = get_algorithm(cfg.algorithm.name)
        self.critic = ValueModel(model_path, torch.float32) if has_critic(self.algo) else None
        self.pad_id = self.model.config.pad_token_id or 0
        self.sync = WeightSync(lcfg, self.device, self.compute_dtype, self.model, self.lora_modules)
        self.dp: lg.GroupInfo | None = None  # the learner group, joined by init_learner_group or at first use
        self.listeners: dict[int, object] = {}  # port -> the listening socket of a store this rank hosts (pick_port)
        self.trainer: Trainer | None = None
        self.checkpoints: Checkpoints | None = None

    def node_id(self) -> str:
        import ray  # here, not at the top: the learner runs without Ray too (tests/gpu, bench/learner_memory.py)

        return ray.get_runtime_context().get_node_id()

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def init_learner_group(self, host: str, port: int, rank: int, world: int, name: str) -> bool:
        self._shard(lg.init_learner_group(host, port, rank, world, self.backend(), self.device, name, self.listeners.get(port)))
        return True

    def _ready(self) -> lg.GroupInfo:
        """The group this learner trains in: world 1 (a one-process group) unless init_learner_group joined another."""
        if self.dp is None:
            self._shard(lg.single_group(self.backend(), self.device))
        return self.dp

    def _shard(self, group: lg.GroupInfo) -> None:
        """FSDP2 over the group for each model, then the optimizers on the sharded (fp32) parameters."""
        if self.dp is not None:
            raise RuntimeError("the learner is already in a group")
        self.dp, lcfg = group, self.cfg.learner
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device.index if self.device.index is not None else 0)
        for model in (self.model, self.ref_model, self.critic):
            if model is not None:
                shard_model(model, group, self.compute_dtype, lcfg.offload)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(trainable, lr=lcfg.lr, weight_decay=lcfg.weight_decay)
        self.critic_opt = None
        if self.critic is not None:
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=lcfg.critic_lr, weight_decay=lcfg.weight_decay)
        self.trainer = Trainer(self.cfg, self.device, group, self.algo, self.pad_id, self.model, self.opt, self.ref_model, self.critic, self.critic_opt)
        self.checkpoints = Checkpoints(self.trainer, self.model_path, self.compute_dtype, lcfg.lora, self.lora_modules)
        self.sync.plan()
        # FSDP2 fixes each unit's gradient dtypes (reduce in fp32, then the master's dtype) at the model's first
        # forward, from which parameters require grad then; peft's `disable_adapter` (the LoRA reference pass) turns
        # requires_grad off on the adapter, so the first forward must not be the reference's: one token, now
        with torch.no_grad():
            self.model(input_ids=torch.tensor([[self.pad_id]], device=self.device))

    def close(self) -> None:
        if self.dp is not None:
            lg.close(self.dp)

    # ---- weight publishing (actors/learner_sync.py) ----------------------------------

    def pick_port(self, host: str) -> int:
        """A port on `host` for a group's store that this rank hosts: its socket is bound and listening from now on
        (on `host` only) and kept for the store (`init_learner_group`, `init_weight_sync`)."""
        sock = listen_socket(host)
        port = sock.getsockname()[1]
        self.listeners[port] = sock  # a group rebuilt gets a new port; the few old ones stay open with their stores
        return port

    def weight_meta(self) -> list[list]:
        self._ready()
        return self.sync.weight_meta()

    def backend(self) -> str:
        """The torch.distributed backend of the learner's groups: gloo on CPUs, NCCL on GPUs (`learner.backend`)."""
        return self.sync.backend()

    def transport(self) -> tuple[str, str]:
        """(learner.weight_transport, backend): what an engine needs to build its end of the weight sync."""
        return self.sync.transport()

    def init_weight_sync(self, host: str, port: int, world_size: int, name: str) -> bool:
        """(Re)build the weight group `name` (rank 0); a version still in flight to the old group is abandoned."""
        self._ready()
        self.sync.init_weight_sync(host, port, world_size, name, self.listeners.get(port))
        return True

    def send_weights(self) -> SentWeights:
        """Post the weights to the engines (rank 0) without waiting for them: bytes, seconds, the payload they need.
        Every rank of the group calls it: the gathers are collectives."""
        return self.sync.send_weights(self._ready().rank)

    def weights_loaded(self) -> bool:
        """Every engine has loaded the version sent last: what was kept for it may go."""
        self.sync.weights_loaded()
        return True

    # ---- training (actors/learner_step.py) -------------------------------------------

    def train_step(self, samples: list[dict], version: int) -> dict:
        """One algorithm step on `samples`, whose newest policy is `version`: its metrics."""
        self._ready()
        return self.trainer.train_step(samples, version)

    def _proximal_from_update(self, groups: torch.Tensor) -> torch.Tensor:
        """Trainer.proximal_from_update, for tests."""
        self._ready()
        return self.trainer.proximal_from_update(groups)

    # ---- inspection ----------------------------------------------------------------

    def parameters_and_grads(self, which: str = "policy") -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """{name: (weight, grad)} of the policy (or "critic") whole, on the CPU, for tests and debugging (a collective:
        every rank calls it)."""
        self._ready()
        model = {"policy": self.model, "critic": self.critic}[which]
        full = lambda t: lg.full_tensor(t, self.device).cpu().clone()  # noqa: E731
        return {n: (full(p), None if p.grad is None else full(p.grad)) for n, p in model.named_parameters()}

    def gathered_weights(self) -> list[tuple[str, torch.Tensor]]:
        """(checkpoint name, tensor) of exactly what a sync sends the engines, on the CPU, for tests (a collective)."""
        self._ready()
        return self.sync.gathered_weights()

    def held_numel(self) -> tuple[int, int]:
        """(elements of the policy's weights this rank holds, elements of the whole policy): its FSDP2 share."""
        self._ready()
        params = list(self.model.parameters())
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
        return local, sum(p.numel() for p in params)

    def sequence_logprobs(self, token_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Log-probs of each next token of `token_ids` under the policy (a collective: every rank calls it)."""
        self._ready()
        ids = torch.tensor([token_ids], device=self.device)
        with torch.no_grad():
            logits = self.model(ids).logits[0, :-1].float() / temperature  # [T-1, V]
            lps = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        return lps.tolist()

    # ---- checkpoints and the exported model (actors/learner_state.py; each a collective) ----

    def save_checkpoint(self, directory: str) -> str:
        """The learner's shards and counters in `directory` (the same directory on every rank); the path of its shards."""
        self._ready()
        return self.checkpoints.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> int:
        """Continue from a checkpoint written at any learner world size. Returns steps done."""
        self._ready()
        return self.checkpoints.load_checkpoint(directory)

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        """Checkpoints.full_state_dict, for tests."""
        self._ready()
        return self.checkpoints.full_state_dict()

    def save_policy(self, path: str) -> str:
        """The policy's state_dict alone (a snapshot for offline evaluation), written atomically by rank 0."""
        self._ready()
        return self.checkpoints.save_policy(path)

    def save(self, path: str, tokenizer_from: str) -> str:
        """The policy as a Hugging Face directory (with LoRA the adapter too, in `path`/adapter), written by rank 0."""
        self._ready()
        return self.checkpoints.save(path, tokenizer_from)


def _check_memory(cfg: Config, model_path: str, rank: int, device: torch.device, compute_dtype: torch.dtype) -> mem.MemoryEstimate:
    """Print what each rank will hold and fail, before loading weights, when it cannot fit (asyncrl/core/memory.py)."""
    lcfg, lora = cfg.learner, cfg.learner.lora
    counts = mem.model_counts(model_path, lora if lora.rank > 0 else None, has_critic(get_algorithm(cfg.algorithm.name)))
    size = compute_dtype.itemsize
    ref = reference_kept(cfg.algorithm) or lora.rank > 0
    est = mem.estimate(counts, lcfg.num_workers, size, ref, lcfg.offload)
    if rank == 0:
        print(f"learner memory per rank ({counts.params / 1e6:.1f} M parameters, {counts.trainable / 1e6:.1f} M trained, "
              f"{lcfg.num_workers} worker(s), {cfg.model.dtype} compute, offload={lcfg.offload}; activations not counted):\n{est.table()}", flush=True)
    alternatives = {"learner.offload=true": mem.estimate(counts, lcfg.num_workers, size, ref, True),
                    f"learner.num_workers={2 * lcfg.num_workers}": mem.estimate(counts, 2 * lcfg.num_workers, size, ref, lcfg.offload)}
    if device.type == "cuda" and not lcfg.offload:
        mem.check_fits(est, mem.device_capacity_gb(device), alternatives)
    elif device.type == "cpu":
        mem.check_fits(est, mem.device_capacity_gb(device), {})
    return est
