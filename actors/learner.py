"""Learner: the HF policy in torch, one algorithm step per batch, weight publishing.

The learner knows no algorithm by name: advantages and the losses come from
the plugin `algorithm.name` resolves to; a plugin with `critic = True` gets a
value model trained next to the policy. Each step: collate, recompute
log-probs (proximal, and the frozen reference for KL) and old values,
advantages, mini-batch updates with gradient accumulation over micro-batches
(policy, then critic), metrics.
"""
from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from asyncrl.algorithms import AdvantageInputs, LossInputs, get_algorithm
from asyncrl.algorithms.correction import mismatch_metrics
from asyncrl.algorithms.base import KL_ESTIMATORS, LossOutput, ValueLossInputs, as_advantages, has_critic, kl_k3, masked_mean, token_level_rewards
from asyncrl.core.batching import Batch, collate, length_sorted_micro_batches, rowwise, sequence_stats, token_logprobs, token_logprobs_batched
from asyncrl.core.config import Config
from asyncrl.core.messages import SentWeights
from asyncrl.core.shaping import shaped_reward
from asyncrl.core import learner_group as lg
from asyncrl.core import memory as mem
from asyncrl.core.sharding import shard_model
from asyncrl.core.models.value import ValueModel
from asyncrl.core.util import pin_to_cores
from asyncrl.core import lora as lora_lib
from asyncrl.core.hf_export import ADAPTER_DIR, write_hf_model
from asyncrl.core.weights import free_port, make_sender, plan_buckets, resolve_backend, tensor_meta, unpack


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Learner:
    """One rank of the learner group (`asyncrl.core.learner_group`): its FSDP2 shard of the policy, the critic and the
    reference. Models are loaded in fp32 (the master weights) and sharded when the group is joined
    (`init_learner_group`; world 1 joins a one-process group at first use)."""

    def __init__(self, cfg: Config, model_path: str, rank: int = 0) -> None:
        cores = cfg.learner.cpu_affinity
        pin_to_cores([cores[rank % len(cores)]] if cores and cfg.learner.num_workers > 1 else cores)
        torch.set_num_threads(cfg.learner.torch_threads)
        torch.manual_seed(cfg.run.seed)
        self.cfg, self.device, self.model_path = cfg, _device(cfg.learner.device), model_path
        self.compute_dtype = getattr(torch, cfg.model.dtype)  # forward and backward; the master weights are fp32
        lcfg, lora = cfg.learner, cfg.learner.lora
        self.memory = self._check_memory(rank)  # before any weight is loaded
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if lcfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora_modules: list[str] | None = None  # LoRA: the checkpoint modules a weight sync sends, merged
        self.ref_model = None  # the frozen reference: none when nothing reads it, the adapter off with LoRA
        if lora.rank > 0:
            self.model = lora_lib.wrap(self.model, lora.rank, lora.alpha, lora.target_modules, lora.top_layers)
            self.lora_modules = lora_lib.sync_modules(self.model)
        elif self._reference_kept():
            self.ref_model = copy.deepcopy(self.model).to(self.compute_dtype).eval().requires_grad_(False)
        self.model.train()
        self.algo = get_algorithm(cfg.algorithm.name)
        self.critic = ValueModel(model_path, torch.float32) if has_critic(self.algo) else None
        self.pad_id = self.model.config.pad_token_id or 0
        self.sender = None  # this end of the weight transport (rank 0 only; asyncrl.core.weights.make_sender)
        self.dp: lg.GroupInfo | None = None  # the learner group, joined by init_learner_group or at first use
        self.steps_done = 0
        self.skipped_steps = 0
        self.last_good: tuple[dict, dict] | None = None

    def _check_memory(self, rank: int) -> mem.MemoryEstimate:
        """Print what each rank will hold and fail, before loading weights, when it cannot fit (asyncrl/core/memory.py)."""
        lcfg, lora = self.cfg.learner, self.cfg.learner.lora
        counts = mem.model_counts(self.model_path, lora if lora.rank > 0 else None, has_critic(get_algorithm(self.cfg.algorithm.name)))
        size = self.compute_dtype.itemsize
        ref = self._reference_kept() or lora.rank > 0
        est = mem.estimate(counts, lcfg.num_workers, size, ref, lcfg.offload)
        if rank == 0:
            print(f"learner memory per rank ({counts.params / 1e6:.1f} M parameters, {counts.trainable / 1e6:.1f} M trained, "
                  f"{lcfg.num_workers} worker(s), {self.cfg.model.dtype} compute, offload={lcfg.offload}; activations not counted):\n{est.table()}", flush=True)
        alternatives = {"learner.offload=true": mem.estimate(counts, lcfg.num_workers, size, ref, True),
                        f"learner.num_workers={2 * lcfg.num_workers}": mem.estimate(counts, 2 * lcfg.num_workers, size, ref, lcfg.offload)}
        if self.device.type == "cuda" and not lcfg.offload:
            mem.check_fits(est, mem.device_capacity_gb(self.device), alternatives)
        elif self.device.type == "cpu":
            mem.check_fits(est, mem.device_capacity_gb(self.device), {})
        return est

    def node_id(self) -> str:
        import ray  # here, not at the top: the learner runs without Ray too (tests/gpu, bench/learner_memory.py)

        return ray.get_runtime_context().get_node_id()

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def init_learner_group(self, host: str, port: int, rank: int, world: int) -> bool:
        self._shard(lg.init_learner_group(host, port, rank, world, self.backend(), self.device))
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
        if self.critic is not None:
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=lcfg.critic_lr, weight_decay=lcfg.weight_decay)
        self.sync_meta = tensor_meta(self._sync_shapes())
        self.buckets = plan_buckets(self.sync_meta, lcfg.sync_bucket_bytes)
        # FSDP2 fixes each unit's gradient dtypes (reduce in fp32, then the master's dtype) at the model's first
        # forward, from which parameters require grad then; peft's `disable_adapter` (the LoRA reference pass) turns
        # requires_grad off on the adapter, so the first forward must not be the reference's: one token, now
        with torch.no_grad():
            self.model(input_ids=torch.tensor([[self.pad_id]], device=self.device))

    def close(self) -> None:
        if self.dp is not None:
            lg.close(self.dp)

    # ---- weight publishing ---------------------------------------------------------

    def pick_port(self, host: str) -> int:
        return free_port(host)

    def _sync_shapes(self) -> list[tuple[str, torch.Tensor]]:
        """(checkpoint name, a tensor of the sent shape and dtype) of what a sync sends: every parameter, or with LoRA
        the adapted layers (merged) and their fused siblings. No data is read: the shapes are the global ones."""
        dtype = self.compute_dtype
        if self.lora_modules is None:
            return [(n, torch.empty(p.shape, dtype=dtype, device="meta")) for n, p in self.model.named_parameters()]
        return [(f"{n}.weight", torch.empty(lora_lib.base_weight(self.model, n).shape, dtype=dtype, device="meta")) for n in self.lora_modules]

    def _gathered_buckets(self) -> Iterator[torch.Tensor]:
        """Each send bucket, packed flat in the engines' dtype, gathered from the shards one bucket at a time: the
        extra memory of a sync is a bucket, not a model. A collective: every rank iterates it to the end."""
        full = lambda t: lg.full_tensor(t, self.device)  # noqa: E731
        params = None if self.lora_modules is not None else dict(self.model.named_parameters())
        with torch.no_grad():
            for bucket in self.buckets:
                names = [self.sync_meta[i].name for i in bucket]
                if params is not None:
                    tensors = [full(params[n]) for n in names]
                else:
                    tensors = [lora_lib.merged_weight(self.model, n.removesuffix(".weight"), full) for n in names]
                yield torch.cat([t.to(self.compute_dtype).reshape(-1) for t in tensors])

    def weight_meta(self) -> list[list]:
        self._ready()
        return [[m.name, m.dtype, list(m.shape)] for m in self.sync_meta]

    def backend(self) -> str:
        """The torch.distributed backend of the learner's groups: gloo on CPUs, NCCL on GPUs (`learner.backend`)."""
        return resolve_backend(self.cfg.learner.backend, self.device)

    def transport(self) -> tuple[str, str]:
        """(learner.weight_transport, backend): what an engine needs to build its end of the weight sync."""
        return self.cfg.learner.weight_transport, self.backend()

    def init_weight_sync(self, host: str, port: int, world_size: int) -> bool:
        """(Re)build the weight group (rank 0); a version still in flight to the old group is abandoned."""
        self._ready()
        if self.sender is None:
            self.sender = make_sender(self.cfg.learner.weight_transport, self.backend())
        self.sender.connect(host, port, world_size)
        return True

    def send_weights(self) -> SentWeights:
        """Gather the weights bucket by bucket and post each to the engines (rank 0), returning without waiting for
        the engines: bytes, seconds and the payload they need to receive them (None for a broadcast; CUDA IPC
        handles). Every rank of the group calls it: the gathers are collectives."""
        self._ready()
        t0 = time.monotonic()
        buckets = self._gathered_buckets()
        if self.dp.rank == 0:
            sent, payload = self.sender.send(buckets)
        else:
            sent, payload = 0, None
            for _ in buckets:
                pass
        return SentWeights(bytes=sent, seconds=time.monotonic() - t0, payload=payload)

    def weights_loaded(self) -> bool:
        """Every engine has loaded the version sent last: what was kept for it may go."""
        self.sender.release()
        return True

    # ---- training ------------------------------------------------------------------

    def train_step(self, samples: list[dict], version: int) -> dict:
        t0 = time.time()
        self._ready()
        a = self.cfg.algorithm
        batch = collate(samples, self.pad_id, self.device, a.mask_truncated)
        max_new = self.cfg.rollout.max_new_tokens
        batch.rewards = torch.tensor([shaped_reward(s, a, max_new) for s in samples], device=self.device)
        temp = self.cfg.rollout.temperature
        pending = self._proximal_from_update(batch.size)  # rows whose pi_prox the update's forward passes fill in
        fused = bool(pending.any())
        with torch.no_grad():  # each worker computes its rows, then all hold the whole batch's
            mine = batch.select(lg.shard(torch.arange(batch.size, device=self.device), self.dp))
            ref = lg.gather_rows(self._ref_logprobs(mine, temp), self.dp) if self._reference_needed() else None
            micro = self.cfg.learner.micro_batch_size  # each pass below runs a micro-batch at a time, as the updates do
            old_values = lg.gather_rows(rowwise(lambda sub: (self.critic(sub),), mine, micro)[0], self.dp) if self.critic is not None else None
            if fused:  # one learner: the other rows' pi_prox in one pass now
                proximal, entropy = torch.zeros_like(batch.behavior_logprobs), torch.zeros_like(batch.behavior_logprobs)
                rest = (~pending).nonzero().squeeze(-1)
                if rest.numel():
                    proximal[rest], entropy[rest] = token_logprobs_batched(self.model, batch.select(rest), temp, micro, with_entropy=True)
            else:
                proximal, entropy = (lg.gather_rows(t, self.dp) for t in token_logprobs_batched(self.model, mine, temp, micro, with_entropy=True))
        mask = batch.response_mask
        in_reward = a.kl_penalty == "reward" and a.kl_coef > 0
        metrics, kl_tokens = ({}, None) if fused or ref is None else self._kl_metrics(proximal, ref, mask)
        token_rewards = token_level_rewards(batch.rewards, mask, kl_tokens[a.kl_estimator] if in_reward else None, a.kl_coef)
        adv_in = AdvantageInputs(token_rewards.sum(-1), batch.group_index, mask, token_rewards, old_values)
        adv = as_advantages(self.algo.compute_advantages(adv_in, a), mask, self.critic is not None)
        skipped = 0
        if self._kl_guard(metrics):
            def policy_loss(micro: torch.Tensor, sub: Batch) -> LossOutput:
                T = sub.width  # the micro-batch is cut to its longest row
                fill = bool(pending[micro].any())  # a micro-batch lies within one mini-batch: all its rows or none
                logprobs, sub_entropy = token_logprobs(self.model, sub, temp, with_entropy=fill)
                if fill:  # no optimizer step before this forward (or correction=none): its log-probs stand for pi_prox
                    proximal[micro, :T], entropy[micro, :T] = logprobs.detach(), sub_entropy
                    pending[micro] = False
                sub_ref = None if ref is None else ref[micro, :T]
                inputs = LossInputs(logprobs, proximal[micro, :T], sub.behavior_logprobs, adv.advantages[micro, :T], sub.response_mask, sub_ref)
                return self.algo.policy_loss(inputs, a)

            update_metrics, skipped = self._updates(batch, self.model, self.opt, policy_loss, "loss/policy", "learner/grad_norm")
            metrics.update(update_metrics)
            if self.critic is not None:
                def value_loss(micro: torch.Tensor, sub: Batch) -> LossOutput:
                    T = sub.width
                    inputs = ValueLossInputs(self.critic(sub), old_values[micro, :T], adv.returns[micro, :T], sub.response_mask)
                    return self.algo.value_loss(inputs, a)

                critic_metrics, critic_skipped = self._updates(batch, self.critic, self.critic_opt, value_loss, "loss/value", "critic/grad_norm")
                metrics.update(critic_metrics)
                skipped += critic_skipped
        if fused and ref is not None:
            metrics.update(self._kl_metrics(proximal, ref, mask)[0])
        metrics.update(sequence_stats(samples, version))
        metrics.update(mismatch_metrics(proximal, batch.behavior_logprobs, mask, self._fresh_rows(samples, version), a))
        if a.overlong_penalty > 0:  # reward/mean above is the task's; this is what the penalty took off it
            metrics["reward/overlong_penalty_mean"] = metrics["reward/mean"] - batch.rewards.mean().item()
        metrics.update({
            "kl/behavior": masked_mean(kl_k3(batch.behavior_logprobs, proximal), mask).item(),
            "learner/entropy": masked_mean(entropy, mask).item(),
            "learner/advantage_abs_mean": masked_mean(adv.advantages.abs(), mask).item(),
            "learner/skipped_updates": skipped,
            "learner/skipped_total": self.skipped_steps,
            "learner/lr": self.opt.param_groups[0]["lr"],
            "learner/peak_mem_gb": mem.peak_memory_gb(self.device),
            "time/train_start": t0,
            "time/train_end": time.time(),
        })
        self.steps_done += 1
        if self.cfg.learner.delay_s:
            time.sleep(self.cfg.learner.delay_s)
        return metrics

    def _fresh_rows(self, samples: list[dict], version: int) -> torch.Tensor:
        """[B] bool: every token of the sample was sampled by the weights the learner holds now (version `version`,
        and no unpublished update since: a step where learner.sync_every divides the steps done)."""
        held = self.steps_done % self.cfg.learner.sync_every == 0
        return torch.tensor([held and s["policy_version_start"] == version == s["policy_version_end"] for s in samples], device=self.device)

    def _mini_batches(self, size: int) -> tuple[torch.Tensor, ...]:
        """The rows of each of the step's `learner.mini_batches` updates."""
        return torch.arange(size, device=self.device).chunk(self.cfg.learner.mini_batches)

    def _proximal_from_update(self, size: int) -> torch.Tensor:
        """[B] bool: the rows whose pi_prox (the policy's log-probs before this step) comes from the update's own
        forward passes instead of a separate pass without gradient: those of the first mini-batch (no optimizer step
        precedes their forward: exact; with one mini-batch, no separate pass at all) and, with
        `algorithm.correction=none`, every row (its loss does not use pi_prox: the keep masks and the mismatch metrics
        then see the policy at the start of each mini-batch, as AReaL's `recompute_logprob: false`). Only with one
        learner (the rows stay local) and nothing that needs the KL before the update (a KL alert, KL in the reward)."""
        a = self.cfg.algorithm
        rows = torch.zeros(size, dtype=torch.bool, device=self.device)
        if self._ready().world == 1 and a.kl_alert <= 0 and not (a.kl_penalty == "reward" and a.kl_coef > 0):
            rows[self._mini_batches(size)[0]] = True
            rows |= a.correction == "none"
        return rows

    def _ref_logprobs(self, batch: Batch, temp: float) -> torch.Tensor:
        """Log-probs of the frozen reference policy [B, T]: the initial model, or with LoRA the adapter switched off."""
        micro = self.cfg.learner.micro_batch_size
        if self.ref_model is not None:
            return token_logprobs_batched(self.ref_model, batch, temp, micro)[0]
        with self.model.disable_adapter():
            return token_logprobs_batched(self.model, batch, temp, micro)[0]

    def _reference_kept(self) -> bool:
        """A reference policy is kept when something reads it: the KL penalty, the KL alert or the kl/ref metric."""
        a = self.cfg.algorithm
        return a.kl_coef > 0 or a.kl_alert > 0 or a.kl_ref_every > 0

    def _reference_needed(self) -> bool:
        """The KL is used (penalty, alert) or this is a monitoring step (`algorithm.kl_ref_every`)."""
        a = self.cfg.algorithm
        if a.kl_coef > 0 or a.kl_alert > 0:
            return True
        return a.kl_ref_every > 0 and self.steps_done % a.kl_ref_every == 0

    def _kl_metrics(self, proximal: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> tuple[dict, dict]:
        """kl/ref_* of the policy before the step against the reference, and the per-token values [B, T] by estimator."""
        kl_tokens = {k: fn(proximal, ref) * mask for k, fn in KL_ESTIMATORS.items()}
        metrics = {f"kl/ref_{k}": masked_mean(kl, mask).item() for k, kl in kl_tokens.items()}
        metrics["kl/ref"] = metrics[f"kl/ref_{self.cfg.algorithm.kl_estimator}"]
        return metrics, kl_tokens

    def _kl_guard(self, metrics: dict) -> bool:
        """Alert on kl/ref above `algorithm.kl_alert`; returns False when this batch must not be trained on."""
        a = self.cfg.algorithm
        if a.kl_alert <= 0:
            return True
        if metrics["kl/ref"] <= a.kl_alert:
            if a.kl_action == "rollback":  # these weights are good: remember them
                self.last_good = copy.deepcopy((self.model.state_dict(), self.opt.state_dict()))
            return True
        metrics["alert/kl"] = 1.0
        if a.kl_action == "reduce_lr":
            for group in self.opt.param_groups:
                group["lr"] *= 0.5
        elif a.kl_action == "rollback" and self.last_good is not None:
            self.model.load_state_dict(self.last_good[0])
            self.opt.load_state_dict(self.last_good[1])
            metrics["alert/rolled_back"] = 1.0
            return False
        return True

    def _updates(self, batch: Batch, model, opt, loss_fn, loss_key: str, grad_key: str) -> tuple[dict, int]:
        """Mini-batch updates of `model`; each is the mean over its units whatever the micro-batch split
        and the number of learner workers (each takes its shard of every mini-batch). FSDP2 reduce-scatters the
        mean of the workers' gradients: times the world size over the total units, that is the batch's mean."""
        lcfg, acc, skipped = self.cfg.learner, {}, 0
        params = [p for group in opt.param_groups for p in group["params"]]  # the sharded trainable ones (LoRA: the adapter)
        lengths = batch.attention_mask.sum(-1)  # [B]
        for mini in self._mini_batches(batch.size):
            opt.zero_grad(set_to_none=True)
            outs = []
            for micro in length_sorted_micro_batches(lg.shard(mini, self.dp), lengths, lcfg.micro_batch_size):
                out = loss_fn(micro, batch.select(micro).trimmed())
                # a sum over units, divided by their total below; NaN/inf poisons the gradient on
                # purpose so the grad-norm check skips the whole update
                (out.loss * out.weight).backward()
                outs.append(out)
            total = lg.sum_scalar(sum(o.weight for o in outs), self.dp) or 1.0
            for p in params:
                if p.grad is not None:
                    p.grad *= self.dp.world / total
            for o in outs:
                _accumulate(acc, {**o.metrics, loss_key: o.loss.item()}, o.weight / total / lcfg.mini_batches)
            skipped += int(not self._optimizer_step(params, opt, acc, grad_key))
        grad_norm = acc.pop(grad_key)
        return {**lg.reduce_metrics(acc, self.dp), grad_key: grad_norm}, skipped

    def _optimizer_step(self, params: list[torch.Tensor], opt, acc: dict, grad_key: str) -> bool:
        clip = self.cfg.learner.grad_clip or math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        norm = (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()
        acc[grad_key] = norm
        if not math.isfinite(norm):
            opt.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            return False
        opt.step()
        return True

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
        return [(n, t.cpu().clone()) for flat, bucket in zip(self._gathered_buckets(), self.buckets) for n, t in unpack(flat, self.sync_meta, bucket)]

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

    # ---- checkpoints and the exported model --------------------------------------------

    def _train_state(self) -> dict:
        """The sharded state of every trained model and optimizer (DTensors: each rank holds its shards)."""
        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        state = {"model": model_sd, "optimizer": optim_sd}
        if self.critic is not None:
            state["critic"], state["critic_optimizer"] = get_state_dict(self.critic, self.critic_opt)
        return state

    def save_checkpoint(self, directory: str) -> str:
        """learner/ (torch.distributed.checkpoint: every rank writes its shards) and learner-rank<R>.pt (counters and
        RNG). A collective: every rank calls it with the same directory (on storage every rank's node reaches)."""
        self._ready()
        path = f"{directory}/{CHECKPOINT_DIR}"
        dcp.save(self._train_state(), checkpoint_id=path)
        counters = {"steps_done": self.steps_done, "skipped_steps": self.skipped_steps, "torch_rng": torch.get_rng_state(),
                    "world": self.dp.world, "critic": self.critic is not None}
        torch.save(counters, f"{directory}/learner-rank{self.dp.rank}.pt")
        return path

    def load_checkpoint(self, directory: str) -> int:
        """Continue from a checkpoint written at any learner world size (DCP reshards); the reference policy stays
        the run's initial model. Returns steps done."""
        self._ready()
        if not os.path.isdir(f"{directory}/{CHECKPOINT_DIR}"):
            raise ValueError(f"{directory} has no {CHECKPOINT_DIR}/: not a learner checkpoint of this version of asyncrl")
        own = f"{directory}/learner-rank{self.dp.rank}.pt"
        counters = torch.load(own if os.path.isfile(own) else f"{directory}/learner-rank0.pt", weights_only=True)
        if self.critic is not None and not counters["critic"]:
            raise ValueError(f"{directory} has no critic: it was written by a run without one")
        state = self._train_state()
        dcp.load(state, checkpoint_id=f"{directory}/{CHECKPOINT_DIR}")
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        if self.critic is not None:
            set_state_dict(self.critic, self.critic_opt, model_state_dict=state["critic"], optim_state_dict=state["critic_optimizer"])
        self.steps_done, self.skipped_steps = counters["steps_done"], counters["skipped_steps"]
        torch.set_rng_state(counters["torch_rng"].cpu())
        return self.steps_done

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's whole state dict on rank 0's CPU, gathered one tensor at a time (other ranks: {}). With LoRA
        the peft model's keys (adapter and base). A collective."""
        self._ready()
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def _plain_state_dict(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """An ordinary Hugging Face state dict of the policy (with LoRA: the adapter merged into its layers)."""
        if self.lora_modules is None:
            return full
        lora = self.cfg.learner.lora
        return lora_lib.merge_state_dict(full, lora.alpha / lora.rank)

    def save_policy(self, path: str) -> str:
        """The policy's state_dict alone (a snapshot for offline evaluation), written atomically by rank 0. A collective."""
        plain = self._plain_state_dict(self._full_state_dict())
        if self.dp.rank == 0:
            tmp = f"{path}.tmp"
            torch.save(plain, tmp)
            os.replace(tmp, path)
        return path

    def save(self, path: str, tokenizer_from: str) -> str:
        """The policy as a Hugging Face directory (`from_pretrained` reads it; the final model, a checkpoint's hf/), in
        model.dtype, and with LoRA the adapter alone too, as a peft adapter in `path`/adapter. Written by rank 0
        (asyncrl.core.hf_export, as `python -m asyncrl.export` writes one); a collective."""
        full = self._full_state_dict()
        if self.dp.rank != 0:
            return path
        write_hf_model(path, self.model_path, self._plain_state_dict(full), self.compute_dtype, tokenizer_from)
        if self.lora_modules is not None:
            lora_lib.save_adapter(self.model, full, f"{path}/{ADAPTER_DIR}")
        return path


CHECKPOINT_DIR = "learner"
"""The sharded learner state inside a run checkpoint (torch.distributed.checkpoint's format)."""


def _accumulate(acc: dict, metrics: dict, weight: float) -> None:
    """Token-weighted means across micro-batches; /max and /min keys keep the extreme."""
    for key, value in metrics.items():
        if key.endswith("/max"):
            acc[key] = max(acc.get(key, -math.inf), value)
        elif key.endswith("/min"):
            acc[key] = min(acc.get(key, math.inf), value)
        else:
            acc[key] = acc.get(key, 0.0) + value * weight
