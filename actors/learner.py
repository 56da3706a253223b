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

import ray
import torch
from transformers import AutoModelForCausalLM

from algorithms import AdvantageInputs, LossInputs, get_algorithm
from algorithms.correction import mismatch_metrics
from algorithms.base import KL_ESTIMATORS, LossOutput, ValueLossInputs, as_advantages, has_critic, kl_k3, masked_mean, token_level_rewards
from asyncrl.core.batching import Batch, collate, sequence_stats, token_logprobs
from asyncrl.core.config import Config
from asyncrl.core.messages import SentWeights
from asyncrl.core.shaping import shaped_reward
from asyncrl.core import learner_group as lg
from asyncrl.core.models.value import ValueModel
from asyncrl.core.util import pin_to_cores
from asyncrl.core import lora as lora_lib
from asyncrl.core.weights import bucket_buffers, flatten_into_buckets, free_port, make_sender, plan_buckets, resolve_backend, tensor_meta, unpack


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Learner:
    def __init__(self, cfg: Config, model_path: str, rank: int = 0) -> None:
        cores = cfg.learner.cpu_affinity
        pin_to_cores([cores[rank % len(cores)]] if cores and cfg.learner.num_workers > 1 else cores)
        torch.set_num_threads(cfg.learner.torch_threads)
        torch.manual_seed(cfg.run.seed)
        self.cfg, self.device = cfg, _device(cfg.learner.device)
        dtype = getattr(torch, cfg.model.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device)
        lora = cfg.learner.lora
        self.lora_modules: list[str] | None = None  # LoRA: the checkpoint modules a weight sync sends, merged
        if lora.rank > 0:  # the reference policy is this model with the adapter off: no second copy
            self.model = lora_lib.wrap(self.model, lora.rank, lora.alpha, lora.target_modules, lora.top_layers)
            self.lora_modules = lora_lib.sync_modules(self.model)
            self.ref_model = None
        else:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.model.train()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(trainable, lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay)
        self.algo = get_algorithm(cfg.algorithm.name)
        self.critic = ValueModel(model_path, dtype).to(self.device) if has_critic(self.algo) else None
        if self.critic is not None:
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=cfg.learner.critic_lr, weight_decay=cfg.learner.weight_decay)
        self.pad_id = self.model.config.pad_token_id or 0
        self.sender = None  # this end of the weight transport (rank 0 only; asyncrl.core.weights.make_sender)
        self.weight_wait_s = 0.0  # this step's wait for a version in flight to leave the parameters
        self.flat_weights: list[torch.Tensor] | None = None  # what a sync sends, one flat buffer per send bucket
        self.merge_views: list[torch.Tensor] | None = None  # LoRA: each merged weight's place in flat_weights
        self.dp = lg.GroupInfo()  # the learner group; world 1 until init_learner_group
        self.steps_done = 0
        self.skipped_steps = 0
        self.last_good: tuple[dict, dict] | None = None

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()

    def init_learner_group(self, host: str, port: int, rank: int, world: int) -> bool:
        self.dp = lg.init_learner_group(host, port, rank, world, self.backend())
        modules = [self.model] + ([self.critic] if self.critic is not None else [])
        lg.broadcast_params([p for m in modules for p in m.parameters()], self.dp)
        return True

    def close(self) -> None:
        lg.close(self.dp)

    # ---- weight publishing ---------------------------------------------------------

    def pick_port(self, host: str) -> int:
        return free_port(host)

    def _sync_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """(checkpoint name, tensor) of what a sync sends: every parameter, or with LoRA the adapted layers merged."""
        if self.lora_modules is None:
            return list(self.model.named_parameters())
        return lora_lib.merged_named_weights(self.model, self.lora_modules)

    def weight_meta(self) -> list[list]:
        return [[m.name, m.dtype, list(m.shape)] for m in tensor_meta(self._sync_tensors())]

    def backend(self) -> str:
        """The torch.distributed backend of the learner's groups: gloo on CPUs, NCCL on GPUs (`learner.backend`)."""
        return resolve_backend(self.cfg.learner.backend, self.device)

    def transport(self) -> tuple[str, str]:
        """(learner.weight_transport, backend): what an engine needs to build its end of the weight sync."""
        return self.cfg.learner.weight_transport, self.backend()

    def init_weight_sync(self, host: str, port: int, world_size: int) -> bool:
        """(Re)build the weight group; a version still in flight to the old group is abandoned."""
        self.params = [p for _, p in self.model.named_parameters()]
        meta = tensor_meta(self._sync_tensors())
        self.buckets = plan_buckets(meta, self.cfg.learner.sync_bucket_bytes)
        if self.sender is None:
            transport = self.cfg.learner.weight_transport
            if transport == "broadcast" and self.lora_modules is not None:  # buffers the merged weights are written into
                self.flat_weights = bucket_buffers(meta, self.buckets, self.device)
                self.merge_views = [v for buf, bucket in zip(self.flat_weights, self.buckets) for _, v in unpack(buf, meta, bucket)]
            elif transport == "broadcast":  # the policy's parameters then live in the send buckets
                self.flat_weights = flatten_into_buckets(self.params, self.buckets)
            self.sender = make_sender(transport, self.backend(), self.params, self.buckets, self.flat_weights)
        self.sender.connect(host, port, world_size)
        return True

    def send_weights(self) -> SentWeights:
        """Post the current weights and return without waiting for the engines: bytes, seconds and the payload the
        engines need to receive them (None for a broadcast; CUDA IPC handles). With a broadcast the weights are sent
        in place: the next optimizer step waits for the transfer, the forward and backward passes before it do not."""
        t0 = time.monotonic()
        if self.merge_views is not None:  # LoRA: merge into the send buffers once the version before has left them
            self.sender.wait()
            with torch.no_grad():
                for view, (_, weight) in zip(self.merge_views, self._sync_tensors()):
                    view.copy_(weight)
        sent, payload = self.sender.send()
        return SentWeights(bytes=sent, seconds=time.monotonic() - t0, payload=payload)

    def weights_loaded(self) -> bool:
        """Every engine has loaded the version sent last: what was kept for it may go."""
        self.sender.release()
        return True

    def _weights_writable(self) -> None:
        """The weights are about to change: the version in flight must have left them (timed: `time/weight_wait_s`).
        With LoRA the send buffers are not the parameters, so nothing waits."""
        if self.sender is not None and self.merge_views is None:
            t0 = time.monotonic()
            self.sender.wait()
            self.weight_wait_s += time.monotonic() - t0

    # ---- training ------------------------------------------------------------------

    def train_step(self, samples: list[dict], version: int) -> dict:
        t0 = time.time()
        self.weight_wait_s = 0.0
        a = self.cfg.algorithm
        batch = collate(samples, self.pad_id, self.device, a.mask_truncated)
        max_new = self.cfg.rollout.max_new_tokens
        batch.rewards = torch.tensor([shaped_reward(s, a, max_new) for s in samples], device=self.device)
        temp = self.cfg.rollout.temperature
        fused = self._proximal_from_update()
        with torch.no_grad():  # each worker computes its rows, then all hold the whole batch's
            mine = batch.select(lg.shard(torch.arange(batch.size, device=self.device), self.dp))
            ref = lg.gather_rows(self._ref_logprobs(mine, temp), self.dp) if self._reference_needed() else None
            old_values = lg.gather_rows(self.critic(mine), self.dp) if self.critic is not None else None
            if fused:  # filled in by the update's own forward passes
                proximal, entropy = torch.zeros_like(batch.behavior_logprobs), torch.zeros_like(batch.behavior_logprobs)
            else:
                proximal, entropy = (lg.gather_rows(t, self.dp) for t in token_logprobs(self.model, mine, temp, with_entropy=True))
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
                logprobs, sub_entropy = token_logprobs(self.model, sub, temp, with_entropy=fused)
                if fused:  # no optimizer step before this forward: its log-probs are the proximal policy's
                    proximal[micro, :T], entropy[micro, :T] = logprobs.detach(), sub_entropy
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
            "time/weight_wait_s": self.weight_wait_s,
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

    def _proximal_from_update(self) -> bool:
        """True when the policy's log-probs before this step (pi_prox) can come from the update's own forward passes,
        saving one forward pass over the batch: one mini-batch (no optimizer step before any forward), one learner
        (the rows stay local), and nothing that needs the KL before the update (a KL alert, KL in the reward)."""
        a, lcfg = self.cfg.algorithm, self.cfg.learner
        return lcfg.mini_batches == 1 and self.dp.world == 1 and a.kl_alert <= 0 and not (a.kl_penalty == "reward" and a.kl_coef > 0)

    def _ref_logprobs(self, batch: Batch, temp: float) -> torch.Tensor:
        """Log-probs of the frozen reference policy [B, T]: the initial model, or with LoRA the adapter switched off."""
        if self.ref_model is not None:
            return token_logprobs(self.ref_model, batch, temp)[0]
        with self.model.disable_adapter():
            return token_logprobs(self.model, batch, temp)[0]

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
            self._weights_writable()
            self.model.load_state_dict(self.last_good[0])
            self.opt.load_state_dict(self.last_good[1])
            metrics["alert/rolled_back"] = 1.0
            return False
        return True

    def _updates(self, batch: Batch, model, opt, loss_fn, loss_key: str, grad_key: str) -> tuple[dict, int]:
        """Mini-batch updates of `model`; each is the mean over its units whatever the micro-batch split
        and the number of learner workers (each takes its shard of every mini-batch)."""
        lcfg, acc, skipped = self.cfg.learner, {}, 0
        params = [p for p in model.parameters() if p.requires_grad]  # with LoRA the adapter only: all-reduced, clipped
        lengths = batch.attention_mask.sum(-1)  # [B]
        for mini in torch.arange(batch.size, device=self.device).chunk(lcfg.mini_batches):
            opt.zero_grad(set_to_none=True)
            outs = []
            rows = lg.shard(mini, self.dp)
            rows = rows[torch.argsort(lengths[rows], stable=True)]  # similar lengths together: little padding per micro-batch
            for micro in rows.split(lcfg.micro_batch_size):
                out = loss_fn(micro, batch.select(micro).trimmed())
                # a sum over units, divided by their total below; NaN/inf poisons the gradient on
                # purpose so the grad-norm check skips the whole update
                (out.loss * out.weight).backward()
                outs.append(out)
            total = lg.sum_scalar(sum(o.weight for o in outs), self.dp) or 1.0
            lg.sum_grads(params, self.dp)
            for p in params:
                if p.grad is not None:
                    p.grad /= total
            for o in outs:
                _accumulate(acc, {**o.metrics, loss_key: o.loss.item()}, o.weight / total / lcfg.mini_batches)
            skipped += int(not self._optimizer_step(params, opt, acc, grad_key))
        grad_norm = acc.pop(grad_key)
        return {**lg.reduce_metrics(acc, self.dp), grad_key: grad_norm}, skipped

    def _optimizer_step(self, params: list[torch.Tensor], opt, acc: dict, grad_key: str) -> bool:
        clip = self.cfg.learner.grad_clip or math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, clip).item()
        acc[grad_key] = norm
        if not math.isfinite(norm):
            opt.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            return False
        self._weights_writable()
        opt.step()
        return True

    # ---- inspection ----------------------------------------------------------------

    def parameters_and_grads(self) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """{name: (weight, grad)} on the CPU, for tests and debugging."""
        return {n: (p.detach().cpu().clone(), None if p.grad is None else p.grad.cpu().clone()) for n, p in self.model.named_parameters()}

    def sequence_logprobs(self, token_ids: list[int], temperature: float = 1.0) -> list[float]:
        ids = torch.tensor([token_ids], device=self.device)
        with torch.no_grad():
            logits = self.model(ids).logits[0, :-1].float() / temperature  # [T-1, V]
            lps = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        return lps.tolist()

    def save_checkpoint(self, directory: str) -> str:
        """learner.pt: policy, critic, optimizers, counters and RNG (every rank holds the same; rank 0 writes)."""
        state = {
            "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
            "steps_done": self.steps_done, "skipped_steps": self.skipped_steps, "torch_rng": torch.get_rng_state(),
        }
        if self.critic is not None:
            state.update(critic=self.critic.state_dict(), critic_optimizer=self.critic_opt.state_dict())
        path = f"{directory}/learner.pt"
        torch.save(state, path)
        return path

    def save_policy(self, path: str) -> str:
        """The policy's state_dict alone (a snapshot for offline evaluation), written atomically."""
        tmp = f"{path}.tmp"
        torch.save(self._plain_model().state_dict(), tmp)
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, directory: str) -> int:
        """Continue from learner.pt; the reference policy stays the run's initial model. Returns steps done."""
        state = torch.load(f"{directory}/learner.pt", map_location=self.device, weights_only=True)
        self._weights_writable()
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        if self.critic is not None:
            if "critic" not in state:
                raise ValueError(f"{directory} has no critic: it was written by a run without one")
            self.critic.load_state_dict(state["critic"])
            self.critic_opt.load_state_dict(state["critic_optimizer"])
        self.steps_done, self.skipped_steps = state["steps_done"], state["skipped_steps"]
        torch.set_rng_state(state["torch_rng"].cpu())
        return self.steps_done

    def _plain_model(self) -> torch.nn.Module:
        """The policy as an ordinary Hugging Face model (with LoRA: a merged copy; the adapter stays in training)."""
        if self.lora_modules is None:
            return self.model
        return copy.deepcopy(self.model).merge_and_unload()

    def save(self, path: str, tokenizer_from: str) -> str:
        from transformers import AutoTokenizer

        self._plain_model().save_pretrained(path)
        AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(path)
        return path


def _accumulate(acc: dict, metrics: dict, weight: float) -> None:
    """Token-weighted means across micro-batches; /max and /min keys keep the extreme."""
    for key, value in metrics.items():
        if key.endswith("/max"):
            acc[key] = max(acc.get(key, -math.inf), value)
        elif key.endswith("/min"):
            acc[key] = min(acc.get(key, math.inf), value)
        else:
            acc[key] = acc.get(key, 0.0) + value * weight
