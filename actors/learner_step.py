"""The learner's training step: one algorithm step on a batch of samples.

Collate, the passes without gradient (the reference for KL, the critic's old
values, the proximal log-probs), advantages, mini-batch updates with gradient
accumulation over micro-batches (policy, then critic), metrics. The models,
optimizers and learner group are the `Learner`'s (actors/learner.py).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from functools import partial

import torch
from torch.distributed.tensor import DTensor

from asyncrl.algorithms import AdvantageInputs, LossInputs
from asyncrl.algorithms.base import KL_ESTIMATORS, Advantages, LossOutput, ValueLossInputs, as_advantages, kl_k3, masked_mean, token_level_rewards
from asyncrl.algorithms.correction import mismatch_metrics
from asyncrl.core import learner_group as lg
from asyncrl.core import memory as mem
from asyncrl.core.batching import (Batch, Sharing, collate, measured_pass_positions, micro_batches, packs, rowwise, sequence_stats,
                                   token_logprobs, token_logprobs_batched)
from asyncrl.core.config import AlgorithmConfig, Config, LearnerConfig
from asyncrl.core.shaping import shaped_reward


def reference_kept(a: AlgorithmConfig) -> bool:
    """A reference policy is kept when something reads it: the KL penalty, the KL alert or the kl/ref metric."""
    return a.kl_coef > 0 or a.kl_alert > 0 or a.kl_ref_every > 0


@dataclass
class StepTensors:
    """One step's batch and what the passes before the update give it, all [B, T] but `pending` [B]."""
    batch: Batch
    pending: torch.Tensor  # the rows whose pi_prox the update's forward passes fill in (emptied as they do)
    fused: bool  # some rows were pending: one learner, the KL to the reference measured after the update
    proximal: torch.Tensor
    entropy: torch.Tensor
    ref: torch.Tensor | None
    old_values: torch.Tensor | None
    adv: Advantages | None = None  # set once the advantages are computed


def sharing(lcfg: LearnerConfig, model, device: torch.device) -> Sharing | bool:
    """learner.share_prompt with a pass's fixed cost (`learner.pass_overhead_tokens`, or measured on the model now);
    False, with nothing measured, where the model's attention cannot run a prompt once (`packs`)."""
    if not lcfg.share_prompt or not packs(model):
        return False
    per_pass = lcfg.pass_overhead_tokens
    if per_pass is None:
        per_pass = measured_pass_positions(model, device)
        print(f"asyncrl: learner: a pass costs as much as {per_pass:.0f} token positions besides its own (measured; "
              "learner.pass_overhead_tokens): a group's prompt runs once where that is cheaper", flush=True)
    return Sharing(per_pass)


class Trainer:
    """The training side of one learner rank: the step and its counters, on the `Learner`'s sharded models."""

    def __init__(self, cfg: Config, device: torch.device, dp: lg.GroupInfo, algo, pad_id: int, model, opt,
                 ref_model=None, critic=None, critic_opt=None) -> None:
        self.cfg, self.device, self.dp, self.algo, self.pad_id = cfg, device, dp, algo, pad_id
        self.model, self.opt, self.ref_model, self.critic, self.critic_opt = model, opt, ref_model, critic, critic_opt
        self.share = sharing(cfg.learner, model, device)  # a group's prompt runs once in its passes where it pays
        self.agree = lambda n: lg.max_int(n, dp)  # the workers' passes: as many micro-batches on each (FSDP2 gathers per pass)
        self.steps_done = 0
        self.skipped_steps = 0
        self.last_good: tuple[dict, dict] | None = None

    def train_step(self, samples: list[dict], version: int) -> dict:
        """One algorithm step on `samples` (their newest policy `version`): its metrics."""
        t0 = time.time()
        a = self.cfg.algorithm
        s = self._passes(self._collate(samples))
        mask = s.batch.response_mask
        metrics, kl_tokens = ({}, None) if s.fused or s.ref is None else self._kl_metrics(s.proximal, s.ref, mask)
        in_reward = a.kl_penalty == "reward" and a.kl_coef > 0
        token_rewards = token_level_rewards(s.batch.rewards, mask, kl_tokens[a.kl_estimator] if in_reward else None, a.kl_coef)
        adv_in = AdvantageInputs(token_rewards.sum(-1), s.batch.group_index, mask, token_rewards, s.old_values)
        s.adv = as_advantages(self.algo.compute_advantages(adv_in, a), mask, self.critic is not None)
        skipped = self._update(s, metrics) if self._kl_guard(metrics) else 0
        if s.fused and s.ref is not None:
            metrics.update(self._kl_metrics(s.proximal, s.ref, mask)[0])
        metrics.update(self._step_metrics(samples, version, s, skipped, t0))
        self.steps_done += 1
        if self.cfg.learner.delay_s:
            time.sleep(self.cfg.learner.delay_s)
        return metrics

    def _collate(self, samples: list[dict]) -> Batch:
        """The samples as one padded batch on the device, with their shaped rewards."""
        a = self.cfg.algorithm
        batch = collate(samples, self.pad_id, self.device, a.mask_truncated)
        batch.rewards = torch.tensor([shaped_reward(s, a, self.cfg.rollout.max_new_tokens) for s in samples], device=self.device)
        return batch

    def _passes(self, batch: Batch) -> StepTensors:
        """The passes without gradient before the update: the reference's and the proximal log-probs (those the update
        does not fill in), the critic's old values. Each worker computes its rows, then all hold the whole batch's."""
        temp, micro = self.cfg.rollout.temperature, self.cfg.learner.micro_batch_size  # a micro-batch at a time, as the updates
        pending = self.proximal_from_update(batch.group_index)
        fused = bool(pending.any())
        with torch.no_grad():
            mine = batch.select(lg.shard(torch.arange(batch.size, device=self.device), self.dp))
            ref = lg.gather_rows(self._ref_logprobs(mine, temp), self.dp) if self._reference_needed() else None
            old_values = lg.gather_rows(rowwise(lambda sub: (self.critic(sub),), mine, micro)[0], self.dp) if self.critic is not None else None
            if fused:  # one learner: the other rows' pi_prox in one pass now
                proximal, entropy = torch.zeros_like(batch.behavior_logprobs), torch.zeros_like(batch.behavior_logprobs)
                rest = (~pending).nonzero().squeeze(-1)
                if rest.numel():
                    proximal[rest], entropy[rest] = token_logprobs_batched(self.model, batch.select(rest), temp, micro, with_entropy=True, share=self.share, agree=self.agree)
            else:
                proximal, entropy = (lg.gather_rows(t, self.dp) for t in token_logprobs_batched(self.model, mine, temp, micro, with_entropy=True, share=self.share, agree=self.agree))
        return StepTensors(batch, pending, fused, proximal, entropy, ref, old_values)

    def _update(self, s: StepTensors, metrics: dict) -> int:
        """The policy's updates, then the critic's; their metrics into `metrics`. Returns the updates skipped."""
        minis, dp, lcfg = self._mini_batches(s.batch.group_index), self.dp, self.cfg.learner
        update_metrics, skipped = updates(s.batch, minis, self.opt, partial(self._policy_loss, s), "loss/policy", "learner/grad_norm", dp, lcfg,
                                          self.share)
        metrics.update(update_metrics)
        if self.critic is not None:
            critic_metrics, critic_skipped = updates(s.batch, minis, self.critic_opt, partial(self._value_loss, s), "loss/value", "critic/grad_norm", dp, lcfg)
            metrics.update(critic_metrics)
            skipped += critic_skipped
        self.skipped_steps += skipped
        return skipped

    def _policy_loss(self, s: StepTensors, micro: torch.Tensor, sub: Batch) -> LossOutput:
        """The algorithm's policy loss on the rows `micro` of the step (`sub`: those rows, trimmed)."""
        T = sub.width  # the micro-batch is cut to its longest row
        fill = bool(s.pending[micro].any())  # a micro-batch lies within one mini-batch: all its rows or none
        logprobs, sub_entropy = token_logprobs(self.model, sub, self.cfg.rollout.temperature, with_entropy=fill, share=self.share)
        if fill:  # no optimizer step before this forward (or correction=none): its log-probs stand for pi_prox
            s.proximal[micro, :T], s.entropy[micro, :T] = logprobs.detach(), sub_entropy
            s.pending[micro] = False
        sub_ref = None if s.ref is None else s.ref[micro, :T]
        inputs = LossInputs(logprobs, s.proximal[micro, :T], sub.behavior_logprobs, s.adv.advantages[micro, :T], sub.response_mask, sub_ref)
        return self.algo.policy_loss(inputs, self.cfg.algorithm)

    def _value_loss(self, s: StepTensors, micro: torch.Tensor, sub: Batch) -> LossOutput:
        """The algorithm's value loss on the rows `micro` of the step (`sub`: those rows, trimmed)."""
        T = sub.width
        inputs = ValueLossInputs(self.critic(sub), s.old_values[micro, :T], s.adv.returns[micro, :T], sub.response_mask)
        return self.algo.value_loss(inputs, self.cfg.algorithm)

    def _step_metrics(self, samples: list[dict], version: int, s: StepTensors, skipped: int, t0: float) -> dict:
        """The step's metrics after the update: samples, mismatch, KL to the behaviour policy, entropy, counters, times."""
        a, batch, mask = self.cfg.algorithm, s.batch, s.batch.response_mask
        metrics = sequence_stats(samples, version)
        metrics.update(mismatch_metrics(s.proximal, batch.behavior_logprobs, mask, self._fresh_rows(samples, version), a))
        if a.overlong_penalty > 0:  # reward/mean above is the task's; this is what the penalty took off it
            metrics["reward/overlong_penalty_mean"] = metrics["reward/mean"] - batch.rewards.mean().item()
        metrics.update({
            "kl/behavior": masked_mean(kl_k3(batch.behavior_logprobs, s.proximal), mask).item(),
            "learner/entropy": masked_mean(s.entropy, mask).item(),
            "learner/advantage_abs_mean": masked_mean(s.adv.advantages.abs(), mask).item(),
            "learner/skipped_updates": skipped,
            "learner/skipped_total": self.skipped_steps,
            "learner/lr": self.opt.param_groups[0]["lr"],
            "learner/peak_mem_gb": mem.peak_memory_gb(self.device),
            "time/train_start": t0,
            "time/train_end": time.time(),
        })
        return metrics

    def _fresh_rows(self, samples: list[dict], version: int) -> torch.Tensor:
        """[B] bool: every token of the sample was sampled by the weights the learner holds now (version `version`,
        and no unpublished update since: a step where learner.sync_every divides the steps done)."""
        held = self.steps_done % self.cfg.learner.sync_every == 0
        return torch.tensor([held and s["policy_version_start"] == version == s["policy_version_end"] for s in samples], device=self.device)

    def _mini_batches(self, groups: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rows of each of the step's `learner.mini_batches` updates of a batch whose rows belong to `groups` ([B]),
        the same on every learner worker."""
        lcfg = self.cfg.learner
        return mini_batch_rows(len(groups), lcfg.mini_batches, lcfg.shuffle, self.cfg.run.seed, self.steps_done, self.device,
                               groups if lcfg.whole_groups else None)

    def proximal_from_update(self, groups: torch.Tensor) -> torch.Tensor:
        """[B] bool: the rows whose pi_prox (the policy's log-probs before this step) comes from the update's own
        forward passes instead of a separate pass without gradient: those of the first mini-batch (no optimizer step
        precedes their forward: exact; with one mini-batch, no separate pass at all) and, with
        `algorithm.correction=none`, every row (its loss does not use pi_prox: the keep masks and the mismatch metrics
        then see the policy at the start of each mini-batch, as AReaL's `recompute_logprob: false`). Only with one
        learner (the rows stay local) and nothing that needs the KL before the update (a KL alert, KL in the reward)."""
        a = self.cfg.algorithm
        rows = torch.zeros(len(groups), dtype=torch.bool, device=self.device)
        if self.dp.world == 1 and a.kl_alert <= 0 and not (a.kl_penalty == "reward" and a.kl_coef > 0):
            rows[self._mini_batches(groups)[0]] = True
            rows |= a.correction == "none"
        return rows

    def _ref_logprobs(self, batch: Batch, temp: float) -> torch.Tensor:
        """Log-probs of the frozen reference policy [B, T]: the initial model, or with LoRA the adapter switched off."""
        micro = self.cfg.learner.micro_batch_size
        if self.ref_model is not None:
            return token_logprobs_batched(self.ref_model, batch, temp, micro, share=self.share, agree=self.agree)[0]
        with self.model.disable_adapter():
            return token_logprobs_batched(self.model, batch, temp, micro, share=self.share, agree=self.agree)[0]

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


def mini_batch_rows(size: int, count: int, shuffle: bool, seed: int, step: int, device=None,
                    groups: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """A batch's rows split into `count` updates: with `shuffle` (and more than one update) a permutation drawn from
    (seed, step), so every worker draws the same and a rerun of the step draws it again; else in arrival order. With
    `groups` ([B], equal within a group: `learner.whole_groups`) the permutation is of the groups, each group's rows
    kept together in their order."""
    if count > 1 and shuffle:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        if groups is None:
            rows = torch.randperm(size, generator=gen)
        else:
            ids, group_of = torch.unique(groups.cpu(), return_inverse=True)
            place = torch.randperm(len(ids), generator=gen)[group_of]  # each row's group's place in the drawn order
            rows = torch.argsort(place * size + torch.arange(size))
    else:
        rows = torch.arange(size)
    return rows.to(device).chunk(count)


def updates(batch: Batch, minis: tuple[torch.Tensor, ...], opt, loss_fn, loss_key: str, grad_key: str, dp: lg.GroupInfo,
            lcfg: LearnerConfig, share: bool = False) -> tuple[dict, int]:
    """An update of the parameters `opt` steps per mini-batch of `minis` (rows of `batch`): the mean loss over its units
    whatever the micro-batch split and the number of learner workers (each takes its shard of every mini-batch). FSDP2
    reduce-scatters the mean of the workers' gradients: times the world size over the total units, that is the batch's
    mean. Returns the metrics and the updates skipped."""
    acc, skipped = {}, 0
    params = [p for group in opt.param_groups for p in group["params"]]  # the sharded trainable ones (LoRA: the adapter)
    for mini in minis:
        opt.zero_grad(set_to_none=True)
        outs = []
        for micro in micro_batches(batch, lg.shard(mini, dp), lcfg.micro_batch_size, share, lambda n: lg.max_int(n, dp)):  # share: a group's prompt once
            out = loss_fn(micro, batch.select(micro).trimmed())
            # a sum over units, divided by their total below; NaN/inf poisons the gradient on
            # purpose so the grad-norm check skips the whole update
            (out.loss * out.weight).backward()
            outs.append(out)
        total = lg.sum_scalar(sum(o.weight for o in outs), dp) or 1.0
        for p in params:
            if p.grad is not None:
                p.grad *= dp.world / total
        for o in outs:
            _accumulate(acc, {**o.metrics, loss_key: o.loss.item()}, o.weight / total / lcfg.mini_batches)
        acc[grad_key] = _clipped_step(params, opt, lcfg.grad_clip or math.inf)
        skipped += int(not math.isfinite(acc[grad_key]))
    grad_norm = acc.pop(grad_key)
    return {**lg.reduce_metrics(acc, dp), grad_key: grad_norm}, skipped


def _clipped_step(params: list[torch.Tensor], opt, clip: float) -> float:
    """Clip the gradient's norm to `clip` and step, unless the norm is not finite (then the gradient is dropped). The
    norm, before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, clip)
    norm = (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()
    if not math.isfinite(norm):
        opt.zero_grad(set_to_none=True)
    else:
        opt.step()
    return norm


def _accumulate(acc: dict, metrics: dict, weight: float) -> None:
    """Token-weighted means across micro-batches; /max and /min keys keep the extreme."""
    for key, value in metrics.items():
        if key.endswith("/max"):
            acc[key] = max(acc.get(key, -math.inf), value)
        elif key.endswith("/min"):
            acc[key] = min(acc.get(key, math.inf), value)
        else:
            acc[key] = acc.get(key, 0.0) + value * weight
