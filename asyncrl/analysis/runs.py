"""Reading a run directory back: metrics, trajectories, summary, and the bottleneck verdict.

Works on a finished run and on one killed mid-way (no summary.json, a partial
last line in metrics.jsonl, only whole Parquet parts: the store writes each
through an atomic rename). Everything here is pure reading and arithmetic; the
CLIs (`asyncrl.inspect`, `asyncrl.plot`) and the notebook are built on it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from asyncrl.core.schema import Status
from asyncrl.core.store import read_trajectories

REWARD_BOUND_WAIT = 0.1
"""Mean wait of a group on scoring, as a share of the mean step, above which (and above the learner's wait for data) a run is reward-bound."""
GENERATION_BOUND_WAIT = 0.40
"""Learner wait above this fraction of step time: the run is generation-bound."""
TRAINING_BOUND_IDLE = 0.30
"""Rollout idle (waiting for admission) above this fraction: the run is training-bound."""
SYNC_ATTENTION = 0.05
"""Weight sync above this fraction of step time needs attention."""


@dataclass
class Run:
    path: Path
    metrics: list[dict]  # one per learner step, in order
    trajectories: pa.Table  # every recorded sample (asyncrl.core.schema.SAMPLE_SCHEMA)
    config: dict | None = None
    summary: dict | None = None  # None: the run did not finish (killed, crashed, still running)
    engine_trace: list[dict] = field(default_factory=list)  # engine_trace.jsonl: {step, worker, t: [...], running: [...]}

    @property
    def finished(self) -> bool:
        return self.summary is not None


@dataclass(frozen=True)
class PairedGain:
    """Accuracy after minus before on the same problems, with the paired standard error of that difference."""
    n: int
    before: float
    after: float
    gain: float
    se: float  # sd of the per-problem differences (n - 1) / sqrt(n); 0 when nothing changed
    gained: int  # problems wrong before and right after
    lost: int  # right before, wrong after


def paired_gain(before: list[float], after: list[float]) -> PairedGain:
    """The paired comparison of two evaluations of the same problems, in the same order (scores in [0, 1])."""
    if len(before) != len(after) or not before:
        raise ValueError(f"paired_gain needs two equally long, non-empty score lists (got {len(before)} and {len(after)})")
    n = len(before)
    diffs = [a - b for b, a in zip(before, after)]
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    return PairedGain(n=n, before=sum(before) / n, after=sum(after) / n, gain=mean, se=math.sqrt(var / n),
                      gained=sum(d > 0 for d in diffs), lost=sum(d < 0 for d in diffs))


def eval_summary(before: list[float] | None, after: list[float] | None) -> dict:
    """The run summary's `eval/` keys from the per-problem scores before and after training (NaN without them)."""
    if before is None or after is None:
        return {"eval/accuracy_before": math.nan, "eval/accuracy_after": math.nan}
    g = paired_gain(before, after)
    return {"eval/accuracy_before": g.before, "eval/accuracy_after": g.after, "eval/problems": g.n,
            "eval/gain_paired_se": g.se, "eval/gained": g.gained, "eval/lost": g.lost}


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl rows; a torn last line (a run killed while writing) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def load_run(run_dir: str | Path) -> Run:
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"no run directory at {path}")
    if not (path / "metrics.jsonl").is_file() and not (path / "trajectories").is_dir():
        raise FileNotFoundError(f"{path} has neither metrics.jsonl nor trajectories/: not an asyncrl run directory")
    config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else None
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else None
    trace = read_metrics(path / "engine_trace.jsonl")  # the same torn-last-line tolerance
    return Run(path, read_metrics(path / "metrics.jsonl"), read_trajectories(path / "trajectories"), config, summary, trace)


@dataclass
class Verdict:
    kind: str  # "generation-bound", "training-bound" or "balanced"
    ratios: dict[str, float]
    advice: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        shown = ", ".join(f"{k} {v:.0%}" for k, v in self.ratios.items())
        return "\n".join([f"{self.kind} ({shown})", *[f"  - {a}" for a in self.advice]])


def bottleneck(metrics: list[dict]) -> Verdict:
    """Which stage holds the pipeline back, from per-step timings (step 0, a cold start, is left out)."""
    rows = metrics[1:] or metrics
    step = sum(m.get("time/step_s", 0.0) for m in rows) or 1e-9
    ratios = {
        "learner wait": sum(m.get("time/learner_wait_s", 0.0) for m in rows) / step,
        "weight sync": sum(m.get("time/weight_sync_s", 0.0) for m in rows) / step,
        "rollout idle": sum(m.get("rollout/idle_frac", 0.0) for m in rows) / max(len(rows), 1),
    }
    if any("reward/group_wait_s" in m for m in rows):  # a reward pool ran
        ratios["reward wait"] = sum(m.get("reward/group_wait_s", 0.0) for m in rows) / step
    advice = []
    if ratios.get("reward wait", 0.0) > max(ratios["learner wait"], REWARD_BOUND_WAIT):
        kind = "reward-bound"
        advice += [
            "add reward actors (reward.num_workers) or give them GPUs: groups wait on scoring longer than the learner waits on generation",
            "mark the reward batched (@reward(batched=True)) and raise reward.batch_size: one call scores many samples",
            "keep reward.cache on for a deterministic reward: repeated responses are not scored again",
        ]
    elif ratios["learner wait"] > GENERATION_BOUND_WAIT:
        kind = "generation-bound"
        advice += [
            "add rollout workers (rollout.num_workers) or engine GPUs: the learner waits for data",
            "raise buffer.max_staleness so generation can run further ahead of training",
            "lower rollout.max_new_tokens if responses are truncated anyway",
        ]
    elif ratios["rollout idle"] > TRAINING_BOUND_IDLE:
        kind = "training-bound"
        advice += [
            "add learner workers (learner.num_workers) or raise learner.micro_batch_size: rollouts wait for admission",
            "raise buffer.max_staleness to let rollouts keep generating while the learner trains",
            "fewer learner.mini_batches means fewer optimizer steps per batch",
        ]
    else:
        kind = "balanced"
        advice.append("neither side waits much; scale both pools together")
    if ratios["weight sync"] > SYNC_ATTENTION:
        advice.append(
            f"weight sync takes {ratios['weight sync']:.0%} of step time: raise learner.sync_every, "
            "raise learner.sync_bucket_mb, or use NCCL on GPUs"
        )
    return Verdict(kind, ratios, advice)


# ---- inspecting a run (`python -m asyncrl.inspect`) ------------------------------------
# Small pure functions over the trajectory table and the metrics rows, so that the
# CLI, the notebook and the tests share one definition of every number.

DRIFT_KEYS = ("kl/ref", "reward/mean")
"""Metrics whose step-to-step jumps `drift_attribution` credits to a learner step."""


def status_counts(table: pa.Table) -> dict[str, int]:
    """Samples per final status; every `Status` is present (zero if absent) so runs compare line by line."""
    counts = {s.value: 0 for s in Status}
    if table.num_rows:
        for item in pc.value_counts(table.column("status")).to_pylist():
            key = item["values"] if item["values"] is not None else "none"
            counts[key] = counts.get(key, 0) + item["counts"]
    return counts


def effective_sample_rate(table: pa.Table) -> float | None:
    """Consumed / all recorded samples: the share of generation that reached the learner (None: nothing recorded)."""
    if not table.num_rows:
        return None
    return status_counts(table)[Status.CONSUMED.value] / table.num_rows


def rollout_cost(table: pa.Table) -> dict | None:
    """Rollout worker-seconds per 1000 consumed samples (None: no worker time or nothing consumed).

    A worker's time is its window from its first group's submission to its last
    recorded generation (or scoring): the worker holds its engine and resources
    that whole while, idle or not. Summing each sample's own latency
    (t_generated - t_submitted) would count the dozens of requests an engine runs
    concurrently many times over, so it is not used. Engine start-up, eval and
    shutdown fall outside the window: a lower bound on what the run cost. Each
    window is read on one worker's own clock, per (run_id, worker_id), so clock
    skew between nodes and a directory reused by a second run do not enter. Only
    exact for a finished run; in a killed one, samples generated but not yet
    flushed are missing from the denominator.
    """
    if not table.num_rows:
        return None
    spans = table.group_by(["run_id", "worker_id"]).aggregate(
        [("t_submitted", "min"), ("t_submitted", "max"), ("t_generated", "max"), ("t_scored", "max")]
    ).to_pylist()
    seconds = 0.0
    for w in spans:
        end = max((w[k] for k in ("t_submitted_max", "t_generated_max", "t_scored_max") if w[k] is not None), default=None)
        if w["t_submitted_min"] is not None and end is not None:
            seconds += end - w["t_submitted_min"]
    consumed = status_counts(table)[Status.CONSUMED.value]
    if seconds <= 0 or not consumed:
        return None
    return {"worker_seconds": seconds, "workers": len(spans), "consumed": consumed, "per_1000_effective": 1000 * seconds / consumed}


def trained_versions(metrics: list[dict]) -> list[int]:
    """The policy version each step trained (and measured kl/ref) at.

    A metrics row's `policy_version` is logged after that step's weight sync, so
    it is one ahead of the weights the step started from whenever it synced; the
    version in force during step t is row t-1's (0 for the first step).
    """
    out, version = [], 0
    for m in metrics:
        out.append(version)
        if _finite(m.get("policy_version")):
            version = int(m["policy_version"])
    return out


def _consumed(table: pa.Table) -> pa.Table:
    return table.filter(pc.equal(table.column("status"), Status.CONSUMED.value))


def by_version(table: pa.Table, metrics: list[dict]) -> list[dict]:
    """Per `policy_version_start` over consumed samples: count, reward mean/std, response length, kl/ref.

    Shows whether later policies earn more reward and drift further from the
    reference. reward_std is the sample std (ddof=1, 0 for one sample), as the
    learner logs `reward/std`. kl_ref_mean averages the metrics rows that trained
    at that version (`trained_versions`): their kl/ref is the KL of exactly the
    weights that generated these samples. None where no row trained at it.
    """
    consumed = _consumed(table)
    if consumed.num_rows:
        consumed = consumed.append_column("response_len", pc.list_value_length(consumed.column("response_ids")))
        groups = consumed.group_by("policy_version_start").aggregate([
            ("reward", "count"), ("reward", "mean"), ("reward", "stddev", pc.VarianceOptions(ddof=1)),
            ("response_len", "mean"), ("status", "count", pc.CountOptions(mode="all")),
        ]).to_pylist()
    else:
        groups = []
    kl: dict[int, list[float]] = {}
    for version, m in zip(trained_versions(metrics), metrics):
        if _finite(m.get("kl/ref")):
            kl.setdefault(version, []).append(float(m["kl/ref"]))
    rows = []
    for g in sorted(groups, key=lambda g: g["policy_version_start"]):
        v = g["policy_version_start"]
        std = g["reward_stddev"]
        rows.append({
            "policy_version": v,
            "samples": g["status_count"],
            "reward_mean": g["reward_mean"],
            "reward_std": 0.0 if std is None and g["reward_count"] == 1 else std,
            "response_len_mean": g["response_len_mean"],
            "kl_ref_mean": sum(kl[v]) / len(kl[v]) if v in kl else None,
        })
    return rows


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def drift_attribution(metrics: list[dict], table: pa.Table, key: str = "kl/ref", top: int = 3) -> list[dict]:
    """The `top` learner steps whose update moved `key` the most, largest |delta| first.

    delta = row[t+1][key] - row[t][key]: metrics at step t+1 are measured with
    the weights step t's batch produced, so the jump is credited to that batch.
    Each entry carries what that batch looked like (reward mean/std, staleness,
    max importance ratio, from row t) and how many recorded consumed samples
    have consumed_step == t (fewer than trained in a killed run whose last parts
    were not flushed).
    """
    per_step: dict[int, int] = {}
    consumed = _consumed(table)
    if consumed.num_rows:
        for item in pc.value_counts(consumed.column("consumed_step")).to_pylist():
            if item["values"] is not None:
                per_step[item["values"]] = item["counts"]
    moves = []
    for a, b in zip(metrics, metrics[1:]):
        if not (_finite(a.get(key)) and _finite(b.get(key))):
            continue
        step = a.get("step")
        moves.append({
            "step": step, "key": key, "delta": b[key] - a[key], "before": a[key], "after": b[key],
            "reward_mean": a.get("reward/mean"), "reward_std": a.get("reward/std"),
            "staleness_mean": a.get("staleness/mean"), "is_ratio_max": a.get("is_ratio/max"),
            "consumed_samples": per_step.get(step, 0),
        })
    moves.sort(key=lambda m: -abs(m["delta"]))
    return moves[:top]


def select(
    table: pa.Table,
    statuses: list[str] | None = None,
    min_version: int | None = None,
    max_version: int | None = None,
    step: int | None = None,
) -> pa.Table:
    """Records matching every given filter (versions on policy_version_start, step on consumed_step)."""
    mask = pa.array([True] * table.num_rows, pa.bool_())
    if statuses:
        mask = pc.and_(mask, pc.is_in(table.column("status"), value_set=pa.array(statuses, pa.string())))
    if min_version is not None:
        mask = pc.and_(mask, pc.greater_equal(table.column("policy_version_start"), min_version))
    if max_version is not None:
        mask = pc.and_(mask, pc.less_equal(table.column("policy_version_start"), max_version))
    if step is not None:
        mask = pc.and_(mask, pc.equal(table.column("consumed_step"), step))
    return table.filter(pc.fill_null(mask, False))


def export_jsonl(table: pa.Table, path: str | Path) -> int:
    """Write records as JSON lines (one sample each, every schema field); returns the count."""
    n = 0
    with Path(path).open("w") as f:
        for batch in table.to_batches(max_chunksize=1024):
            for record in batch.to_pylist():
                f.write(json.dumps(jsonable(record)) + "\n")
                n += 1
    return n


def jsonable(value: object) -> object:
    """NaN and infinities become None, so the output is strict JSON (eval/accuracy is NaN with run.eval=false)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


LENGTH_QUANTILES = (0.5, 0.9, 0.99)


def response_lengths(table: pa.Table) -> dict | None:
    """Distribution of generated response lengths (samples that produced tokens, whatever their status):
    p50 / p90 / p99 / max, and how each finish reason ("stop": EOS, "length": cut at max_new_tokens) counts."""
    generated = table.filter(pc.greater(pc.list_value_length(table.column("response_ids")), 0)) if table.num_rows else table
    if not generated.num_rows:
        return None
    lengths = pc.list_value_length(generated.column("response_ids"))
    quantiles = pc.quantile(lengths, q=list(LENGTH_QUANTILES), interpolation="lower").to_pylist()
    reasons = pc.value_counts(pc.fill_null(generated.column("finish_reason"), "none")).to_pylist()
    return {
        "samples": generated.num_rows, "mean": pc.mean(lengths).as_py(), "max": pc.max(lengths).as_py(),
        **{f"p{round(q * 100)}": v for q, v in zip(LENGTH_QUANTILES, quantiles)},
        "finish_reasons": {r["values"]: r["counts"] for r in reasons},
    }


def episodes_summary(table: pa.Table) -> dict | None:
    """Multi-turn episodes (records with a loss mask): how many, model turns per episode (p50 / max), tool calls,
    and how they ended (`episode_end` counts), with a few sample ids to read with --transcript. None without any."""
    if not table.num_rows or table.column("loss_mask").null_count == table.num_rows:
        return None
    episodes = table.filter(pc.is_valid(table.column("loss_mask"))).select(["sample_id", "turns", "episode_end", "status"]).to_pylist()
    turns = sorted(sum(t["role"] == "model" for t in e["turns"] or []) for e in episodes)
    ends: dict[str, int] = {}
    for e in episodes:
        ends[e["episode_end"] or "(still running)"] = ends.get(e["episode_end"] or "(still running)", 0) + 1
    return {
        "episodes": len(episodes), "turns_p50": turns[len(turns) // 2], "turns_max": turns[-1],
        "tool_calls": sum(t["role"] == "model" and t["tool"] is not None for e in episodes for t in e["turns"] or []),
        "ends": dict(sorted(ends.items(), key=lambda kv: -kv[1])),
        "examples": [e["sample_id"] for e in episodes if e["status"] == "consumed"][:3],
    }


def episode_records(table: pa.Table, sample_ids: list[str]) -> list[dict]:
    """The records of these episodes, in the order given; ValueError naming a missing one or one that is no episode."""
    rows = {r["sample_id"]: r for r in table.filter(pc.is_in(table.column("sample_id"), value_set=pa.array(sample_ids, pa.string()))).to_pylist()}
    missing = [s for s in sample_ids if s not in rows]
    if missing:
        raise ValueError(f"--transcript: no sample {', '.join(missing)} in this run")
    single = [s for s in sample_ids if rows[s]["loss_mask"] is None]
    if single:
        raise ValueError(f"--transcript: {', '.join(single)} is not a multi-turn episode (its run had no env.name)")
    return [rows[s] for s in sample_ids]


def transcript(record: dict) -> str:
    """One episode as a readable transcript: the prompt, then each turn with who wrote it (the model and the policy
    versions of its tokens, or the environment / a tool), its token count and its text; then how it ended."""
    head = (f"episode {record['sample_id']}  status {record['status']}  reward {record['reward']}  "
            f"finish {record['finish_reason']} ({record['episode_end']})")
    lines = [head, f"[prompt, {len(record['prompt_ids'])} tok] {record['prompt_text']}"]
    versions = record["token_versions"] or []
    for turn in record["turns"] or []:
        n = turn["end"] - turn["start"]
        if turn["role"] == "model":
            vs = sorted({v for v in versions[turn["start"]:turn["end"]] if v >= 0})
            who = "model" + (f" v{vs[0]}" if len(vs) == 1 else f" v{vs[0]}-v{vs[-1]}" if vs else "")
            who += f" -> tool {turn['tool']}" if turn["tool"] else ""
        else:
            who = f"tool {turn['tool']}" if turn["tool"] else "environment"
        lines.append(f"[{who}, {n} tok] {turn['text']}")
    return "\n".join(lines)


def report(run: Run) -> dict:
    """Everything `python -m asyncrl.inspect` shows, as one JSON-able dict."""
    t = run.trajectories
    starts = t.column("policy_version_start") if t.num_rows else None
    sampled = pc.min_max(starts).as_py() if starts is not None else {"min": None, "max": None}
    published = run.summary.get("policy_version") if run.summary else None
    if published is None and run.metrics:
        published = run.metrics[-1].get("policy_version")
    verdict = bottleneck(run.metrics)
    return {
        "run_dir": str(run.path),
        "finished": run.finished,
        "steps_logged": len(run.metrics),
        "policy_versions": {"last_published": published, "sampled_min": sampled["min"], "sampled_max": sampled["max"]},
        "samples": {"by_status": status_counts(t), "total": t.num_rows, "effective_rate": effective_sample_rate(t)},
        # only a finished run has every generated sample recorded (see rollout_cost)
        "rollout_cost": rollout_cost(t) if run.finished else None,
        "response_lengths": response_lengths(t),
        "episodes": episodes_summary(t),
        "by_version": by_version(t, run.metrics),
        "drift": {key: drift_attribution(run.metrics, t, key) for key in DRIFT_KEYS},
        "bottleneck": str(verdict),
        "bottleneck_kind": verdict.kind,
    }
