"""One typed config per component, loaded from YAML with dotted overrides.

Every field is declared once, with its meaning next to it. `load_config`
rejects an unknown key, a value of the wrong type and an impossible value with
a `ConfigError` whose message starts with the dotted key, before any actor
starts; `python -m asyncrl.run` turns it into exit status 2.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asyncrl.tasks import TINY_HELD_OUT


class ConfigError(ValueError):
    """A config problem; `key` is the dotted key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass
class ModelConfig:
    path: str = "tiny"
    """"tiny" builds (once, cached) the project's warm-started tiny model; otherwise a local HF model directory."""
    cache_dir: str = ""
    """Where built-in models are cached on each node; empty: $ASYNCRL_CACHE_DIR, else ~/.cache/asyncrl/models (per user, so every job reuses it)."""
    dtype: str = "float32"
    """Weights dtype for learner and engine: float32, bfloat16 or float16."""
    max_model_len: int = 64
    """Longest prompt + response, in tokens."""


@dataclass
class TaskConfig:
    name: str = "addition"
    """Built-in task by name (registered in asyncrl.tasks)."""
    reward: str = "exact_match"
    """Reward by registered name, or a user function by dotted path (pkg.module.fn)."""
    digits: int = 2
    """Operand digits for the addition task."""
    steps: int = 2
    """task.name=word_problems: most operations in one problem (each problem draws 1..steps)."""
    eval_size: int = 200
    """Held-out problems for greedy evaluation before and after training."""
    path: str = ""
    """Local JSONL file for task.name=jsonl (one JSON object per line)."""
    prompt_key: str = "prompt"
    """task.name=jsonl: the record key holding the prompt text."""
    answer_key: str = "answer"
    """task.name=jsonl: the record key holding the reference answer."""
    template: str = ""
    """task.name=jsonl: prompt text made from a record's keys, e.g. "Q: {question}\nA:" (empty: the prompt_key value)."""
    chat: bool = False
    """Wrap each prompt in the tokenizer's chat template as one user turn (instruct models)."""
    reward_timeout_s: float = 30.0
    """Longest one reward call may take; past it the sample (and so its group) is dropped_error. Python cannot kill the call: it keeps one of the worker's 4 reward threads until it returns, and with all 4 held the worker reports an error."""
    max_consecutive_reward_failures: int = 20
    """Stop the run when every sample of this many groups in a row failed scoring (the reward raised or timed out)."""


@dataclass
class RolloutConfig:
    num_workers: int = 1
    """Rollout actors, each owning one vLLM engine."""
    group_size: int = 8
    """Responses sampled per prompt (the GRPO group)."""
    temperature: float = 1.0
    """Sampling temperature; behaviour log-probs are taken after it."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 keeps the exact policy distribution)."""
    max_new_tokens: int = 8
    """Longest response, in tokens."""
    max_inflight_groups: int = 16
    """Groups one worker keeps in its engine at once."""
    kv_cache_gib: float = 1.0
    """KV cache per engine on the CPU (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = 0.4
    """Engine memory fraction on a GPU (ignored on the CPU)."""
    num_cpus: float = 1.0
    """Ray CPUs reserved per rollout actor."""
    num_gpus: float = 0.0
    """Ray GPUs reserved per rollout actor."""
    cpu_affinity: list[int] = field(default_factory=list)
    """Cores to pin each rollout actor to (empty: no pinning)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each rollout actor needs (e.g. {rollout_node: 1}, a label given to `ray start --resources`)."""
    weight_update: str = "keep"
    """Requests running when new weights arrive: keep (pause, load, resume them: later tokens come from the new version; their KV is recomputed), abort (abort them and resubmit from the prompt: every token of the sample comes from the new version) or drain (stop admitting, let them finish, then load)."""
    max_restarts: int = 3
    """Rollout worker replacements allowed per run: a worker whose process dies is replaced (its unfinished groups are recorded as dropped_error with the reason); past this many the run stops."""


@dataclass
class BufferConfig:
    max_staleness: int = 1
    """Largest learner_version - policy_version_start trained on; 0 is synchronous on-policy."""
    capacity_groups: int = 64
    """Groups held at most; producers are refused admission beyond it."""
    sample_timeout_s: float = 600.0
    """How long the learner waits for a batch before the run fails."""
    store_flush_s: float = 5.0
    """Write buffered trajectory records to a new Parquet part at least this often (and every 512 records): a killed run loses at most this much of its record."""


@dataclass
class LoRAConfig:
    rank: int = 0
    """LoRA rank; 0 trains the whole model. With rank > 0 only the adapter (peft) is trained and optimised, the reference policy is the model with the adapter off, and a weight sync sends the merged weights of the adapted layers only (asyncrl/lora.py)."""
    alpha: float = 32.0
    """LoRA scaling numerator: the adapter's delta is (alpha / rank) * B @ A."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Names of the linear layers that get an adapter (every attention and MLP projection of Llama/Qwen models by default)."""
    top_layers: int = 0
    """Adapt only the last this many decoder layers (0: all). The backward pass stops below the lowest adapted layer and a sync sends fewer weights: on a CPU the cheapest way to make a learner step fit."""


@dataclass
class LearnerConfig:
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    batch_size: int = 64
    """Samples per learner step; a multiple of rollout.group_size."""
    mini_batches: int = 1
    """Optimizer updates per batch (PPO epochs split into mini-batches)."""
    micro_batch_size: int = 64
    """Samples per forward/backward; gradients accumulate across micro-batches."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 disables clipping)."""
    sync_every: int = 1
    """Publish a new weight version to the rollout workers every this many steps."""
    sync_bucket_mb: float = 64.0
    """Weights are broadcast in flat buckets of at most this many MiB."""
    backend: str = "auto"
    """Weight broadcast backend: auto (nccl on GPUs, gloo on CPUs), gloo or nccl."""
    weight_transport: str = "broadcast"
    """How weights reach the engines: broadcast (a torch.distributed group, `backend`) or cuda_ipc (learner and engines share one GPU: CUDA IPC handles, no copy; GPU only, untested on CPU machines)."""
    device: str = "auto"
    """Learner device: auto, cpu or cuda."""
    num_cpus: float = 1.0
    """Ray CPUs reserved for the learner actor."""
    num_gpus: float = 0.0
    """Ray GPUs reserved for the learner actor."""
    cpu_affinity: list[int] = field(default_factory=list)
    """Cores to pin the learner workers to (empty: no pinning); with num_workers > 1, worker i takes core cpu_affinity[i % len]."""
    num_workers: int = 1
    """Learner workers: one torch.distributed group (gloo on CPUs, NCCL on GPUs); each takes a shard of the batch, gradients are all-reduced, rank 0 publishes weights."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each learner worker needs (e.g. {learner_node: 1})."""
    torch_threads: int = 1
    """Intra-op threads for the learner's torch."""
    critic_lr: float = 1.0e-3
    """Learning rate of the value model (algorithms with a critic, e.g. ppo)."""
    max_non_finite_steps: int = 5
    """Stop the run (after a checkpoint) when this many steps in a row skipped every update for a non-finite loss, ratio or gradient."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA RL (learner.lora.rank > 0) instead of full fine-tuning."""
    delay_s: float = 0.0
    """Sleep this long after each learner step. Only for ablations: it emulates a slower learner so that rollouts run ahead and staleness becomes real (bench/staleness_ablation.py). Keep 0."""

    @property
    def sync_bucket_bytes(self) -> int:
        return int(self.sync_bucket_mb * 2**20)


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    """Registered algorithm name, or a user module by dotted path."""
    correction: str = "decoupled"
    """Off-policy correction: decoupled (AReaL), tis (truncated IS on pi/pi_behav) or none."""
    clip_low: float = 0.2
    """PPO clip: ratio lower bound 1 - clip_low."""
    clip_high: float = 0.2
    """PPO clip: ratio upper bound 1 + clip_high (raise for DAPO clip-higher)."""
    is_cap: float = 5.0
    """Truncation of the behaviour importance weight pi_prox/pi_behav (or pi/pi_behav for tis)."""
    is_level: str = "token"
    """Importance weight per token, or per sequence (product of its token ratios), for decoupled and tis."""
    std_normalize: bool = True
    """Divide group-relative advantages by the group std (False: Dr. GRPO)."""
    kl_coef: float = 0.0
    """Weight of the KL-to-reference penalty in the loss (0: monitor only)."""
    kl_estimator: str = "k3"
    """KL estimator for the penalty and for `kl/ref`: k1, k2 or k3 (all three are logged)."""
    kl_alert: float = 0.0
    """Raise an alert when kl/ref exceeds this (0: off); see kl_action."""
    kl_ref_every: int = 1
    """Run the reference policy's forward pass (the kl/ref metrics) every N learner steps when only monitoring needs it; 0: never. It runs every step regardless when kl_coef > 0 or kl_alert > 0."""
    kl_action: str = "none"
    """On a KL alert: none (log only), reduce_lr (halve the learning rate) or rollback (restore the last weights under the threshold and skip the batch)."""
    mask_truncated: bool = False
    """Responses cut at rollout.max_new_tokens carry no loss (DAPO's over-long filtering); they still count in their group's reward statistics. Without it a small policy can learn to ramble: see README, "A real model"."""
    loss_agg: str = "token_mean"
    """Loss aggregation: token_mean (DAPO, Dr. GRPO) or seq_mean (per-sequence token mean, original GRPO)."""
    kl_penalty: str = "loss"
    """Where kl_coef applies: loss (a per-token term in the policy loss) or reward (subtracted from the token rewards before advantages, as in PPO-RLHF)."""
    gamma: float = 1.0
    """Discount for GAE (algorithms with a critic)."""
    lam: float = 0.95
    """GAE lambda (algorithms with a critic): 1.0 is Monte-Carlo returns, 0.0 is one-step TD."""
    value_clip: float = 0.2
    """Critic value-loss clip: new values may move at most this far from the old ones per step."""


@dataclass
class LoggingConfig:
    wandb: bool = True
    """Log to wandb (offline unless WANDB_API_KEY is set or wandb_mode=online)."""
    wandb_project: str = "asyncrl"
    """wandb project name."""
    wandb_mode: str = "auto"
    """auto, online, offline."""
    console: bool = True
    """Print a progress line per learner step."""


@dataclass
class RunConfig:
    output_dir: str = "runs/default"
    """Run directory: config, metrics, trajectories, summary, final model."""
    steps: int = 20
    """Learner steps to train."""
    seed: int = 0
    """Seed for data order, sampling and the learner."""
    ray_address: str = ""
    """Ray cluster to join; empty: RAY_ADDRESS, else the cluster `ray start` recorded on this machine if it answers, else a new local one; "local": always a new local one."""
    checkpoint_every: int = 10
    """Write a checkpoint (RUN_DIR/checkpoints/) every this many learner steps, and at the end (0: never)."""
    keep_checkpoints: int = 2
    """Checkpoints kept; older ones are deleted after a newer one is complete."""
    snapshot_every: int = 0
    """Save the policy's weights alone (state_dict, RUN_DIR/snapshots/step-NNNNNN.pt) every N steps, for offline evaluation of the run's learning curve; 0: never. Cheap: no optimizer state, no trajectory flush."""
    eval: bool = True
    """Greedy held-out accuracy before and after training."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @property
    def groups_per_step(self) -> int:
        return self.learner.batch_size // self.rollout.group_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check `value` against a field annotation; ints are accepted for floats."""
    origin = typing.get_origin(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation)
        _check(isinstance(value, list), key, f"expected a list, got {value!r}")
        return [_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(annotation)
        _check(isinstance(value, dict), key, f"expected a mapping, got {value!r}")
        return {str(k): _coerce(f"{key}.{k}", v, item) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        return value  # no optional fields yet
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    ok = isinstance(value, annotation) and not (annotation is int and isinstance(value, bool))
    _check(ok, key, f"expected {annotation.__name__}, got {type(value).__name__} {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        _check(key in names, f"{prefix}{key}", f"unknown key (known: {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            _check(isinstance(value, dict), f"{prefix}{name}", "expected a mapping")
            kwargs[name] = _build(hint, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(f"{prefix}{name}", value, hint)
    return cls(**kwargs)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        _check(isinstance(node, dict), dotted, "is not a section")
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``learner.lr=1e-5`` -> ("learner.lr", 1e-05); values are parsed as YAML scalars."""
    key, sep, raw = text.partition("=")
    _check(bool(sep) and bool(key), text, "override must look like section.key=value")
    value = yaml.safe_load(raw) if raw != "" else ""
    if isinstance(value, str) and _looks_like_float(raw):
        value = float(raw)  # YAML 1.1 reads 1e-5 as a string
    return key.strip(), value


def _looks_like_float(raw: str) -> bool:
    try:
        float(raw)
    except ValueError:
        return False
    return True


def validate(cfg: Config) -> Config:
    """Impossible values, each named by its key."""
    r, b, lr, a = cfg.rollout, cfg.buffer, cfg.learner, cfg.algorithm
    _check(cfg.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype", "must be float32, bfloat16 or float16")
    _check(cfg.model.max_model_len > r.max_new_tokens, "model.max_model_len", "must exceed rollout.max_new_tokens")
    _check(cfg.algorithm.kl_ref_every >= 0, "algorithm.kl_ref_every", "must be >= 0 (0: no reference pass unless the KL is used)")
    _check(cfg.task.eval_size >= 1, "task.eval_size", "must be >= 1")
    _check(
        cfg.model.path != "tiny" or cfg.task.eval_size <= TINY_HELD_OUT,
        "task.eval_size",
        f"must be <= {TINY_HELD_OUT} with model.path=tiny (its warm-start held out only that many problems)",
    )
    _check(1 <= cfg.task.digits <= 6, "task.digits", "must be in 1..6")
    _check(cfg.task.steps >= 1, "task.steps", "must be >= 1")
    _check(cfg.task.name != "jsonl" or bool(cfg.task.path), "task.path", "must name a JSONL file when task.name=jsonl")
    _check(cfg.task.reward_timeout_s > 0, "task.reward_timeout_s", "must be > 0")
    _check(cfg.task.max_consecutive_reward_failures >= 1, "task.max_consecutive_reward_failures", "must be >= 1")
    _check(cfg.model.path != "tiny" or cfg.task.name == "addition", "model.path", "tiny is built for task.name=addition only; give a model directory")
    _check(r.num_workers >= 1, "rollout.num_workers", "must be >= 1")
    _check(r.group_size >= 2, "rollout.group_size", "must be >= 2 (group-relative advantages need a group)")
    _check(r.temperature > 0, "rollout.temperature", "must be > 0 (behaviour log-probs need a sampling policy)")
    _check(0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    _check(r.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    _check(r.max_inflight_groups >= 1, "rollout.max_inflight_groups", "must be >= 1")
    _check(r.kv_cache_gib > 0, "rollout.kv_cache_gib", "must be > 0")
    _check(b.max_staleness >= 0, "buffer.max_staleness", f"must be >= 0 (got {b.max_staleness})")
    _check(b.sample_timeout_s > 0, "buffer.sample_timeout_s", "must be > 0")
    _check(b.store_flush_s > 0, "buffer.store_flush_s", "must be > 0")
    _check(lr.batch_size >= 1, "learner.batch_size", "must be >= 1")
    _check(
        lr.batch_size % r.group_size == 0,
        "learner.batch_size",
        f"must be a multiple of rollout.group_size ({lr.batch_size} % {r.group_size} != 0)",
    )
    _check(b.capacity_groups >= cfg.groups_per_step, "buffer.capacity_groups", "must hold at least one batch")
    _check(lr.lr > 0, "learner.lr", "must be > 0")
    _check(lr.mini_batches >= 1 and lr.batch_size % lr.mini_batches == 0, "learner.mini_batches", "must divide learner.batch_size")
    _check(lr.micro_batch_size >= 1, "learner.micro_batch_size", "must be >= 1")
    _check(lr.sync_every >= 1, "learner.sync_every", "must be >= 1")
    _check(lr.sync_bucket_mb > 0, "learner.sync_bucket_mb", "must be > 0")
    _check(lr.backend in ("auto", "gloo", "nccl"), "learner.backend", "must be auto, gloo or nccl")
    _check(lr.device in ("auto", "cpu", "cuda"), "learner.device", "must be auto, cpu or cuda")
    _check(lr.torch_threads >= 1, "learner.torch_threads", "must be >= 1")
    _check(a.correction in ("decoupled", "tis", "none"), "algorithm.correction", "must be decoupled, tis or none")
    _check(0 < a.clip_low < 1 and a.clip_high > 0, "algorithm.clip_low", "clip_low must be in (0, 1), clip_high > 0")
    _check(a.is_level in ("token", "sequence"), "algorithm.is_level", "must be token or sequence")
    _check(a.is_cap >= 1, "algorithm.is_cap", "must be >= 1")
    _check(a.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0")
    _check(a.kl_estimator in ("k1", "k2", "k3"), "algorithm.kl_estimator", "must be k1, k2 or k3")
    _check(a.kl_alert >= 0, "algorithm.kl_alert", "must be >= 0")
    _check(a.kl_action in ("none", "reduce_lr", "rollback"), "algorithm.kl_action", "must be none, reduce_lr or rollback")
    _check(a.loss_agg in ("token_mean", "seq_mean"), "algorithm.loss_agg", "must be token_mean or seq_mean")
    _check(a.kl_penalty in ("loss", "reward"), "algorithm.kl_penalty", "must be loss or reward")
    _check(0 < a.gamma <= 1, "algorithm.gamma", "must be in (0, 1]")
    _check(0 <= a.lam <= 1, "algorithm.lam", "must be in [0, 1]")
    _check(a.value_clip > 0, "algorithm.value_clip", "must be > 0")
    _check(lr.critic_lr > 0, "learner.critic_lr", "must be > 0")
    _check(lr.delay_s >= 0, "learner.delay_s", "must be >= 0")
    _check(lr.lora.rank >= 0, "learner.lora.rank", "must be >= 0 (0: full fine-tuning)")
    _check(lr.lora.top_layers >= 0, "learner.lora.top_layers", "must be >= 0 (0: every layer)")
    _check(lr.lora.alpha > 0, "learner.lora.alpha", "must be > 0")
    _check(lr.lora.rank == 0 or bool(lr.lora.target_modules), "learner.lora.target_modules", "must name at least one module")
    _check(
        lr.lora.rank == 0 or lr.weight_transport == "broadcast", "learner.lora.rank", "LoRA syncs merged weights by broadcast; cuda_ipc is not supported with it"
    )
    _check(lr.max_non_finite_steps >= 1, "learner.max_non_finite_steps", "must be >= 1")
    _check(lr.num_workers >= 1, "learner.num_workers", "must be >= 1")
    _check(lr.weight_transport in ("broadcast", "cuda_ipc"), "learner.weight_transport", "must be broadcast or cuda_ipc")
    _check(
        lr.weight_transport != "cuda_ipc" or (lr.device != "cpu" and lr.num_gpus > 0 and r.num_gpus > 0),
        "learner.weight_transport",
        "cuda_ipc needs the learner and the engines on a GPU (learner.num_gpus and rollout.num_gpus > 0, e.g. 0.5 each to share one)",
    )
    _check(
        lr.batch_size % (lr.num_workers * lr.mini_batches) == 0,
        "learner.num_workers",
        f"learner.batch_size ({lr.batch_size}) must split evenly into num_workers x mini_batches shards",
    )
    _check(r.max_restarts >= 0, "rollout.max_restarts", "must be >= 0")
    _check(r.weight_update in ("keep", "abort", "drain"), "rollout.weight_update", "must be keep, abort or drain")
    for key, res in (("rollout.resources", r.resources), ("learner.resources", lr.resources)):
        _check(all(v > 0 for v in res.values()), key, "resource amounts must be > 0")
        _check(not {"CPU", "GPU", "memory"} & set(res), key, "use num_cpus / num_gpus for CPU and GPU")
    _check(cfg.logging.wandb_mode in ("auto", "online", "offline"), "logging.wandb_mode", "must be auto, online or offline")
    _check(cfg.run.steps >= 1, "run.steps", "must be >= 1")
    _check(cfg.run.checkpoint_every >= 0, "run.checkpoint_every", "must be >= 0 (0: never)")
    _check(cfg.run.keep_checkpoints >= 1, "run.keep_checkpoints", "must be >= 1")
    _check(cfg.run.snapshot_every >= 0, "run.snapshot_every", "must be >= 0 (0: never)")
    _check(bool(cfg.run.output_dir), "run.output_dir", "must not be empty")
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """YAML file (optional) + dotted overrides -> a validated Config."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        _check(path.is_file(), "--config", f"file not found: {path}")
        loaded = yaml.safe_load(path.read_text()) or {}
        _check(isinstance(loaded, dict), "--config", f"{path} must hold a mapping")
        data = loaded
    for text in overrides:
        _set_dotted(data, *parse_override(text))
    return validate(_build(Config, data, ""))


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config written by `Config.to_dict` (e.g. a run's config.yaml)."""
    return validate(_build(Config, data, ""))
