"""From sample records to padded tensors, and per-token log-probs of a batch.

Targets are aligned with the logits that predict them: position t of every
[B, T] tensor here is token t+1 of ``prompt_ids + response_ids``, and
`response_mask` is 1.0 exactly where that token is a response token the model
sampled: in a multi-turn episode the record's `loss_mask` leaves out the appended
observation tokens, so every algorithm trains on episodes unchanged.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] prompt + response, right-padded
    attention_mask: torch.Tensor  # [B, L]
    response_mask: torch.Tensor  # [B, T=L-1] float
    behavior_logprobs: torch.Tensor  # [B, T] (0 outside the response)
    rewards: torch.Tensor  # [B]
    group_index: torch.Tensor  # [B] int, equal within a group

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def width(self) -> int:
        """T, the token positions of the per-token tensors."""
        return self.response_mask.shape[1]

    def select(self, index: torch.Tensor) -> "Batch":
        return Batch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def trimmed(self) -> "Batch":
        """The same rows cut to the longest one (right padding only): the first `width` positions of every
        per-token tensor of the batch it came from."""
        L = int(self.attention_mask.sum(-1).max())
        return Batch(self.input_ids[:, :L], self.attention_mask[:, :L], self.response_mask[:, : L - 1],
                     self.behavior_logprobs[:, : L - 1], self.rewards, self.group_index)


def group_indices(samples: list[dict]) -> torch.Tensor:
    """[B] int: each sample's group, numbered in the order the groups first appear (`Batch.group_index`)."""
    groups: dict[str, int] = {}
    return torch.tensor([groups.setdefault(s["group_id"], len(groups)) for s in samples])


def collate(samples: list[dict], pad_id: int, device: torch.device | str = "cpu", mask_truncated: bool = False) -> Batch:
    """Right-padded tensors of `samples`. With `mask_truncated`, a response cut at `rollout.max_new_tokens`
    (finish_reason "length") keeps its place, reward and group but none of its tokens carry loss (DAPO's
    over-long filtering): the policy is not taught to ramble by answers that never ended. An episode's
    observation tokens (`loss_mask` 0) never carry loss."""
    width = max(len(s["prompt_ids"]) + len(s["response_ids"]) for s in samples)
    B = len(samples)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    response_mask = torch.zeros((B, width - 1))
    behavior = torch.zeros((B, width - 1))
    for b, s in enumerate(samples):
        p, r = len(s["prompt_ids"]), len(s["response_ids"])
        input_ids[b, : p + r] = torch.tensor(list(s["prompt_ids"]) + list(s["response_ids"]))
        attention[b, : p + r] = 1
        if not (mask_truncated and s["finish_reason"] == "length"):
            mask = s.get("loss_mask")
            response_mask[b, p - 1 : p - 1 + r] = 1.0 if mask is None else torch.tensor(list(mask), dtype=torch.float32)
        behavior[b, p - 1 : p - 1 + r] = torch.tensor(s["behavior_logprobs"], dtype=torch.float32)
    rewards = torch.tensor([float(s["reward"]) for s in samples])
    batch = Batch(input_ids, attention, response_mask, behavior, rewards, group_indices(samples))
    return Batch(**{f.name: getattr(batch, f.name).to(device) for f in fields(batch)})


def first_response_position(batch: Batch) -> int:
    """The first position t (of T) any row's response mask covers; T when none does. Logits before it are never
    read: the prompts' own positions."""
    covered = batch.response_mask.any(0).nonzero()
    return int(covered[0]) if covered.numel() else batch.width


SHARED_PREFIX_MIN = 32
"""A micro-batch whose rows have fewer leading tokens in common than this runs in one pass."""


def shared_prefix(batch: Batch) -> int:
    """P: the leading tokens every row of `batch` has in common, before its first response position (where the logits
    the loss reads begin); 0 for one row or when P < SHARED_PREFIX_MIN. A group's samples share their prompt."""
    if batch.size < 2:
        return 0
    first = min(first_response_position(batch), batch.width - 1)
    head = batch.input_ids[:, :first]
    differs = (head != head[:1]).any(0).nonzero()
    P = int(differs[0]) if differs.numel() else first
    return P if P >= SHARED_PREFIX_MIN else 0


PACKED_MAX_TOKENS = 8192
"""A packed pass (`_packed_logits`) takes at most this many tokens: its attention mask is their square."""


def packs(model) -> bool:
    """Whether `_forward` can run a shared prefix once for `model`: its attention takes a 4D mask (sdpa, eager; not
    FlashAttention-2) and has no sliding window (its window is in the mask the model would make)."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", "sdpa")
    windowed = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    return impl in ("sdpa", "eager") and not windowed


def _forward(model, batch: Batch, first: int, share: bool):
    """The model's logits [B, L - first, V] of positions first..L-1. With `share` and a prefix of P tokens the rows
    have in common (`shared_prefix`), one packed pass (`_packed_logits`) computes the prefix once instead of once per
    row: a group's prompt (an agent's tools listing) once per micro-batch. Not for FlashAttention-2 (no 4D masks) or
    sliding-window attention (its window is in the mask the model would make)."""
    P = shared_prefix(batch) if share and packs(model) else 0
    impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    lengths = batch.attention_mask.sum(-1)
    if P and P + int((lengths - P).sum()) <= PACKED_MAX_TOKENS:
        return _packed_logits(model, batch, first, P, lengths, bool_mask=impl == "sdpa")
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=batch.input_ids.shape[1] - first).logits


def _packed_logits(model, batch: Batch, first: int, P: int, lengths: torch.Tensor, bool_mask: bool) -> torch.Tensor:
    """One sequence: the shared prefix, then each row's tokens after it; each row's tokens see the prefix and their own
    earlier tokens (a 4D mask), at the positions they have in the row. The logits of each row's positions first..its
    end, put back in [B, L - first, V] (zeros past a row's end: padding, as the loss's masks say)."""
    B, L = batch.input_ids.shape
    device = batch.input_ids.device
    ends = lengths.tolist()
    ids, pos, starts = [batch.input_ids[0, :P]], [torch.arange(P, device=device)], []
    n = P
    for b in range(B):
        starts.append(n)
        ids.append(batch.input_ids[b, P : ends[b]])
        pos.append(torch.arange(P, ends[b], device=device))
        n += ends[b] - P
    allowed = torch.zeros((n, n), dtype=torch.bool, device=device)
    allowed[:, :P] = True  # everyone sees the prefix
    for b in range(B):  # and its own tokens before it
        s, e = starts[b], starts[b] + ends[b] - P
        allowed[s:e, s:e] = True
    allowed = allowed.tril()  # and nothing after itself
    if bool_mask:
        mask = allowed[None, None]
    else:
        dtype = next(model.parameters()).dtype
        mask = torch.zeros((1, 1, n, n), dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    kept = [max(0, ends[b] - first) for b in range(B)]  # a row cut before `first` (all its tokens masked) has none
    rows = torch.cat([torch.full((kept[b],), b, device=device) for b in range(B)])
    cols = torch.cat([torch.arange(kept[b], device=device) for b in range(B)])
    keep = torch.cat([torch.arange(starts[b] + ends[b] - P - kept[b], starts[b] + ends[b] - P, device=device) for b in range(B)])
    logits = model(input_ids=torch.cat(ids)[None], attention_mask=mask, position_ids=torch.cat(pos)[None], logits_to_keep=keep).logits[0]
    out = logits.new_zeros((B, L - first, logits.shape[-1]))
    out[rows, cols] = logits
    return out


def token_logprobs(model, batch: Batch, temperature: float, with_entropy: bool = False, share: bool = True):
    """(log-probs of each next token [B, T], entropy [B, T] without gradient or None), logits divided by temperature,
    0 outside the response. The output layer and the softmax run only from the batch's first response position on
    (`logits_to_keep`): the prompt positions' full-vocabulary logits, most of a short answer's tokens, are never made.
    `share`: a prompt the rows have in common runs once (`_forward`)."""
    T = batch.width
    first = min(first_response_position(batch), T - 1)  # one position at least: an update's loss keeps its graph
    logits = _forward(model, batch, first, share)[:, :-1].float()  # positions first..L-1; the last predicts nothing
    logp = torch.log_softmax(logits / temperature, dim=-1)  # [B, T - first, V]
    chosen = logp.gather(-1, batch.input_ids[:, first + 1 :, None]).squeeze(-1)
    pad = lambda t: torch.nn.functional.pad(t, (first, 0))  # noqa: E731  back to [B, T]
    entropy = None
    if with_entropy:  # a metric: no gradient, and no [B, T, V] graph kept for it
        with torch.no_grad():
            entropy = pad(-(logp.exp() * logp).sum(-1))
    return pad(chosen) * batch.response_mask, entropy


def length_sorted_micro_batches(rows: torch.Tensor, lengths: torch.Tensor, size: int) -> tuple[torch.Tensor, ...]:
    """`rows` (indices into a batch) ordered by their `lengths` [B] and split into micro-batches of `size`: rows of
    similar length together, so a micro-batch cut to its longest row carries little padding."""
    return rows[torch.argsort(lengths[rows], stable=True)].split(size)


def group_micro_batches(rows: torch.Tensor, lengths: torch.Tensor, groups: torch.Tensor, size: int) -> tuple[torch.Tensor, ...]:
    """`rows` split by group (in order of first appearance), each group's length-sorted and cut into micro-batches of
    at most `size`: a micro-batch never mixes two groups, so its rows share their prompt."""
    out: list[torch.Tensor] = []
    for g in dict.fromkeys(groups[rows].tolist()):
        mine = rows[groups[rows] == g]
        out += mine[torch.argsort(lengths[mine], stable=True)].split(size)
    return tuple(out)


def positions(micros: tuple[torch.Tensor, ...], lengths: torch.Tensor, starts: torch.Tensor, groups: torch.Tensor | None) -> int:
    """Token positions the passes over `micros` compute: each cut to its longest row; with `groups`, a micro-batch
    within one group computes its rows' common prompt (up to the earliest response start of `starts`) once."""
    total = 0
    for micro in micros:
        width, rows = int(lengths[micro].max()), len(micro)
        prefix = int(starts[micro].min()) if groups is not None and rows > 1 and len(set(groups[micro].tolist())) == 1 else 0
        prefix = prefix if prefix >= SHARED_PREFIX_MIN else 0
        total += prefix + rows * (width - prefix)
    return total


@dataclass(frozen=True)
class Sharing:
    """`share` with a pass's fixed cost: a group's prompt runs once where that costs less, each pass counted as
    `pass_positions` token positions besides those it computes (kernel launches, Python, hooks: on a small model
    several passes of a group each cost more than one pass of the whole batch). `True` counts positions only."""

    pass_positions: float = 0.0


def measured_pass_positions(model, device: torch.device, longest: int = 512, repeats: int = 3) -> float:
    """What a forward and backward pass of `model` costs besides its positions, in token positions, on this device:
    one row of L and one of L / 8 tokens timed (the fastest of `repeats` after a warm-up), t = a + b * L solved for
    a / b, at most 8 L (where the longer row took no measurably longer, a pass is all fixed cost). L must be long
    enough for its positions to show: at 64 tokens a 135M model's pass on a CPU is nearly all fixed cost, and four
    measurements gave 550, 960, 2,301 and 4e10 positions. Every rank of a learner group calls it (its passes are
    collectives); the gradients it makes are dropped."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None) or longest
    long = max(16, min(longest, int(limit)))
    short = max(2, long // 8)

    def timed(n: int) -> float:
        best = math.inf
        ids = torch.ones((1, n), dtype=torch.long, device=device)
        for k in range(repeats + 1):  # the first: a warm-up
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = model(input_ids=ids, logits_to_keep=1).logits.float().sum()
            if out.requires_grad:
                out.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = best if k == 0 else min(best, time.perf_counter() - t0)
        return best

    t_short, t_long = timed(short), timed(long)
    model.zero_grad(set_to_none=True)
    cap = 8.0 * long
    if t_long <= t_short:
        return cap
    per_position = (t_long - t_short) / (long - short)
    return min(max(t_short - per_position * short, 0.0) / per_position, cap)


def split_to(micros: tuple[torch.Tensor, ...], count: int) -> tuple[torch.Tensor, ...]:
    """`micros` with the one of most rows cut in two (in order, so each half stays length-sorted and within its group)
    until there are `count`: every worker of a learner group must run as many passes, since FSDP2 gathers each layer's
    parameters in each pass. `count` is at most the rows of `micros` (each worker holds as many rows)."""
    out = list(micros)
    if count > sum(len(m) for m in out):
        raise ValueError(f"cannot split {sum(len(m) for m in out)} rows into {count} micro-batches")
    while len(out) < count:
        i = max(range(len(out)), key=lambda j: len(out[j]))
        out[i : i + 1] = list(out[i].tensor_split(2))
    return tuple(out)


Agree = Callable[[int], int]  # this worker's number of micro-batches -> the learner group's largest


def micro_batches(batch: Batch, rows: torch.Tensor, size: int, share: bool | Sharing = True, agree: Agree | None = None) -> tuple[torch.Tensor, ...]:
    """The micro-batches of `rows`: length-sorted (`length_sorted_micro_batches`), or with `share` one group at a time
    (`group_micro_batches`) where that computes fewer token positions, each group's prompt once (`_forward`): for
    long prompts and short answers (an agent's tools listing), about a group's size fewer. A `Sharing` adds each
    pass's fixed cost to the count, so many small passes do not win on a small model. With `share`, workers of a
    learner group may count different numbers: `agree` gives the group's largest, and this worker's are `split_to` it."""
    lengths = batch.attention_mask.sum(-1)
    plain = length_sorted_micro_batches(rows, lengths, size)
    if not share or rows.numel() < 2:
        return plain if agree is None else split_to(plain, agree(len(plain)))
    grouped = group_micro_batches(rows, lengths, batch.group_index, size)
    mask = batch.response_mask > 0
    starts = torch.where(mask.any(-1), mask.float().argmax(-1), lengths - 1)  # each row's first response position
    per_pass = getattr(share, "pass_positions", 0.0)  # `Sharing`: a pass's fixed cost weighs in
    cost = lambda micros, groups: per_pass * len(micros) + positions(micros, lengths, starts, groups)  # noqa: E731
    chosen = grouped if cost(grouped, batch.group_index) < cost(plain, None) else plain
    return chosen if agree is None else split_to(chosen, agree(len(chosen)))


def rowwise(fn, batch: Batch, size: int, share: bool = False, agree: Agree | None = None) -> tuple[torch.Tensor | None, ...]:
    """`fn(sub)` -> per-token tensors [b, t] (or None) of each micro-batch of `size` rows (`micro_batches`; `share`: a
    group's rows together where their prompt is worth sharing) cut to its longest row, put back in the batch's row
    order as [B, T] tensors (0 beyond a micro-batch's width). For the passes without gradient over a whole batch (the
    proximal, reference and value passes): their memory is a micro-batch's logits, not the batch's, and their padding
    is a micro-batch's."""
    out: list[torch.Tensor | None] | None = None
    rows = torch.arange(batch.size, device=batch.input_ids.device)
    for micro in micro_batches(batch, rows, size, share, agree):
        parts = fn(batch.select(micro).trimmed())
        if out is None:
            out = [None if p is None else p.new_zeros((batch.size, batch.width)) for p in parts]
        for whole, part in zip(out, parts):
            if whole is not None:
                whole[micro, : part.shape[1]] = part
    return tuple(out or ())


def token_logprobs_batched(model, batch: Batch, temperature: float, size: int, with_entropy: bool = False, share: bool = True,
                           agree: Agree | None = None):
    """`token_logprobs` of a whole batch without gradient, computed `size` rows at a time (see `rowwise`)."""
    with torch.no_grad():
        return rowwise(lambda sub: token_logprobs(model, sub, temperature, with_entropy, share), batch, size, share, agree)


def sequence_stats(samples: list[dict], version: int) -> dict[str, float]:
    """Reward, staleness and length statistics of one batch of records. `staleness/*` is each sample's oldest
    token's; `staleness/token_mean` averages over tokens (keep and resume mix versions within a sample)."""
    rewards = torch.tensor([float(s["reward"]) for s in samples])
    stale = torch.tensor([float(version - s["policy_version_start"]) for s in samples])
    token_stale = [float(version - v) for s in samples for v in _token_versions(s) if v >= 0]  # -1: an observation token
    lengths = torch.tensor([float(len(s["response_ids"])) for s in samples])
    return {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(samples) > 1 else 0.0,
        "staleness/mean": stale.mean().item(),
        "staleness/max": stale.max().item(),
        "staleness/token_mean": sum(token_stale) / max(len(token_stale), 1),
        **response_length_stats(lengths, [s["finish_reason"] for s in samples]),
        "samples/trained": float(len(samples)),
        **episode_stats(samples),
    }


def episode_stats(samples: list[dict]) -> dict[str, float]:
    """Model turns per episode and the share of response tokens the model sampled (none for single-turn samples)."""
    episodes = [s for s in samples if s.get("loss_mask") is not None]
    if not episodes:
        return {}
    turns = [sum(t["role"] == "model" for t in s["turns"]) for s in episodes]
    tokens = sum(len(s["loss_mask"]) for s in episodes)
    return {"episodes/turns_mean": sum(turns) / len(turns), "episodes/turns_max": float(max(turns)),
            "episodes/sampled_token_frac": sum(sum(s["loss_mask"]) for s in episodes) / max(tokens, 1)}


def response_length_stats(lengths: torch.Tensor, finish_reasons: list[str | None]) -> dict[str, float]:
    """Mean, p50, p90 and max response length [B] in tokens, and the fraction cut at `rollout.max_new_tokens`
    (finish_reason "length"): the tail a synchronous trainer waits on."""
    q = torch.quantile(lengths, torch.tensor([0.5, 0.9])).tolist()  # linear interpolation between ranks
    return {
        "samples/response_len_mean": lengths.mean().item(),
        "samples/response_len_p50": q[0],
        "samples/response_len_p90": q[1],
        "samples/response_len_max": lengths.max().item(),
        "samples/truncated_frac": sum(r == "length" for r in finish_reasons) / len(finish_reasons),
    }


def _token_versions(record: dict) -> list[int]:
    """The version of each response token (a record written before schema 2 has none: its start version for all)."""
    versions = record.get("token_versions")
    return list(versions) if versions else [record["policy_version_start"]] * len(record["response_ids"])
