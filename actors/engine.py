"""A small facade over vLLM's in-process engine step loop.

The rollout worker drives the engine itself (`add` / `step` / `abort`), which
starts in seconds on the CPU and lets weights change between two engine steps.
`receive_weights` loads them and recomputes the KV of whatever is still
running, so those requests go on under the new weights (AReaL's interrupted
generation), or keeps that KV (`keep_kv`: PipelineRL's in-flight update);
the worker may instead abort them first (`abort` is immediate and
leaves the other requests running) or step until none is left
(rollout.weight_update). Nothing here knows about RL; SGLang stands behind the
same methods (actors/sglang_engine.py), and actors/engines.py picks one (rollout.engine).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass

EXTENSION = "asyncrl.actors.vllm_ext.WeightSyncExtension"


@dataclass
class Finished:
    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


def _finished(out) -> Finished:
    """A finished vLLM request: its sampled tokens (EOS included when it stopped on it), their log-probs, and
    why it ended: "stop" (EOS or a stop token) or "length" (cut at max_tokens)."""
    comp = out.outputs[0]
    lps = [d[t].logprob for d, t in zip(comp.logprobs or [], comp.token_ids)]
    return Finished(out.request_id, list(comp.token_ids), lps, str(comp.finish_reason))


def check_tensor_parallel(tensor_parallel_size: int, on_gpu: bool) -> None:
    """A ValueError naming the key when an engine that sees no GPU is asked for tensor parallelism (the config
    check catches rollout.num_gpus=0; this catches an actor whose GPUs CUDA cannot see)."""
    if tensor_parallel_size > 1 and not on_gpu:
        raise ValueError(
            f"rollout.tensor_parallel_size={tensor_parallel_size} needs GPUs, and this engine sees none (CUDA is not "
            "available here): use rollout.tensor_parallel_size=1 on the CPU"
        )


def cuda_available() -> bool:
    """Whether this process can use a GPU (a Ray actor with num_gpus=0 sees none: Ray hides them)."""
    import torch

    return torch.cuda.is_available()


def vllm_engine_args(
    model_path: str, dtype: str, max_model_len: int, seed: int, gpu_mem: float, priority: bool = False, *,
    tensor_parallel_size: int = 1, cuda_graphs: bool = True, on_gpu: bool = False,
) -> dict:
    """The keyword arguments of vLLM's `LLM` (its EngineArgs) for this engine; pure, so tested without vLLM.

    On the CPU: eager whatever `cuda_graphs` says, and one rank (`tensor_parallel_size` > 1 is a ValueError naming
    the key, never quietly reduced to 1).
    On a GPU: `enforce_eager=not cuda_graphs`, `tensor_parallel_size`, and with more than one rank the `mp`
    executor: inside a Ray placement group (the rollout pool's) vLLM would otherwise pick its Ray executor and
    ask Ray for GPUs this actor already holds. `gpu_memory_utilization` is passed on both (vLLM's CPU backend
    sizes its cache by VLLM_CPU_KVCACHE_SPACE instead). The GPU arguments have never run here: no GPU with vLLM
    was available (docs/engines-gpu.md)."""
    check_tensor_parallel(tensor_parallel_size, on_gpu)
    args = dict(
        model=model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=seed,
        enforce_eager=not (on_gpu and cuda_graphs),
        tensor_parallel_size=tensor_parallel_size,  # 1 on the CPU (checked above)
        logprobs_mode="processed_logprobs",
        worker_extension_cls=EXTENSION,
        gpu_memory_utilization=gpu_mem,
        scheduling_policy="priority" if priority else "fcfs",  # priority: lower values first
    )
    if on_gpu and tensor_parallel_size > 1:
        args["distributed_executor_backend"] = "mp"
    return args


def configure_cpu_env(kv_cache_gib: float) -> None:
    """vLLM reads these at import/start: in-process engine core, a fixed KV cache size."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(kv_cache_gib)))


class VLLMEngine:
    def __init__(
        self, model_path: str, dtype: str, max_model_len: int, seed: int, kv_cache_gib: float, gpu_mem: float, priority: bool = False,
        tensor_parallel_size: int = 1, cuda_graphs: bool = True,
    ) -> None:
        """`tensor_parallel_size` and `cuda_graphs` apply on a GPU only (`vllm_engine_args`); untested there."""
        configure_cpu_env(kv_cache_gib)
        args = vllm_engine_args(model_path, dtype, max_model_len, seed, gpu_mem, priority, tensor_parallel_size=tensor_parallel_size,
                                cuda_graphs=cuda_graphs, on_gpu=cuda_available())
        from vllm import LLM
        import torch

        self.threads = torch.get_num_threads()  # as the actor set them (rollout.torch_threads); see `_on_engine_threads`
        self.llm = LLM(**args)
        self.tensor_parallel_size = args["tensor_parallel_size"]
        self.engine = self.llm.llm_engine
        self.tokenizer = self.llm.get_tokenizer()
        self.latest: dict[str, object] = {}  # request id -> its newest output while it runs (vLLM's cumulative kind)
        self.salt: str | None = None  # after a load that kept the running requests' KV: the prefix-cache salt of new requests
        self.kv_kept_loads = 0

    def sampling_params(self, temperature: float, top_p: float, max_tokens: int, stop: tuple[str, ...] = ()):
        """Per-request sampling, no per-request seed (a shared seed would give every request one stream). A request
        that ends at a `stop` string keeps every token it sampled (only vLLM's text is cut)."""
        from vllm import SamplingParams

        return SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0,
                              stop=list(stop) or None, include_stop_str_in_output=True)

    def warm_up(self, params, prompt_ids: list[int], n: int = 2) -> float:
        """Generate `n` throw-away samples with `params`; returns the seconds it took.

        The first sampling step that returns log-probs compiles vLLM's `batched_count_greater_than` (torch.compile,
        inductor): measured 2.7 s on the CPU against 0.09 s for the next 64-sample batch. Done at start-up, that
        cost no longer lands on the first training step."""
        t0 = time.perf_counter()
        for i in range(n):
            self.add(f"asyncrl-warm-up-{i}", prompt_ids, params)
        while self.has_unfinished():
            self.step()
        return time.perf_counter() - t0

    def add(self, request_id: str, prompt_ids: list[int], params, priority: int = 0) -> None:
        """Queue a request; with priority scheduling, lower `priority` values are scheduled (and kept) first."""
        self.engine.add_request(request_id, self._prompt(prompt_ids), params, priority=priority)

    def _prompt(self, ids: list[int]) -> dict:
        """vLLM's token prompt; after a load that kept the running requests' KV, salted so that it never matches a
        prefix cached under older weights (`receive_weights(keep_kv=True)`)."""
        return {"prompt_token_ids": ids} if self.salt is None else {"prompt_token_ids": ids, "cache_salt": self.salt}

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished_requests()

    def num_unfinished(self) -> int:
        """Requests added and not finished: the batch the next `step` runs (waiting ones included)."""
        return self.engine.get_num_unfinished_requests()

    def _on_engine_threads(self) -> None:
        """OpenMP's thread count belongs to the calling thread, and the CPU attention kernel fails when it differs
        from the one the step's metadata was planned with: a loop thread or Ray's call thread is given the engine's
        (torch._C's own setter: vLLM's CPU worker replaces torch.set_num_threads with a no-op)."""
        import torch

        if torch.get_num_threads() != self.threads:
            torch._C.set_num_threads(self.threads)

    def step(self) -> list[Finished]:
        self._on_engine_threads()
        done = []
        for out in self.engine.step():
            if out.finished:
                self.latest.pop(out.request_id, None)
                done.append(_finished(out))
            else:
                self.latest[out.request_id] = out
        return done

    def generated(self, request_id: str) -> int:
        """Tokens the running request has sampled so far (0 before its first step)."""
        out = self.latest.get(request_id)
        return len(out.outputs[0].token_ids) if out is not None else 0

    def sample(self, prompts: list[list[int]], params) -> list[Finished]:
        """One sampled response per prompt with `params`, outside the step loop (inspection and tests)."""
        self._on_engine_threads()
        outs = self.llm.generate([self._prompt(p) for p in prompts], params, use_tqdm=False)
        return [_finished(o) for o in outs]

    def abort(self, request_ids: list[str]) -> list[Finished]:
        """Drop these requests now, without stepping: the others keep running. Returns what each had sampled
        (finish_reason "abort"; no tokens if it had not run a step), which rollout.weight_update=resume keeps.

        The in-process engine core handles the abort synchronously: on return the
        requests are gone (not unfinished, no output) and their ids may be added again.
        """
        if request_ids:
            self.engine.abort_request(request_ids)
        partial = [self.latest.pop(rid, None) for rid in request_ids]
        return [dataclasses.replace(_finished(out), finish_reason="abort") if out is not None else Finished(rid, [], [], "abort")
                for rid, out in zip(request_ids, partial)]

    def paused(self):
        """A context in which nothing generates, so `generated` stays exact: this engine runs only when stepped."""
        return contextlib.nullcontext()

    def init_weight_sync(self, host: str, port: int, rank: int, world: int, transport: list, meta: list, bucket_bytes: int, name: str):
        return self.llm.collective_rpc("asyncrl_init_weight_sync", args=(host, port, rank, world, list(transport), meta, bucket_bytes, name))

    def receive_weights(self, payload=None, keep_kv: bool = False) -> int:
        """Receive the next version through the weight transport (`payload`: what the learner's end sent with it).

        By default KV computed by the old weights is not reused: running requests are preempted and re-prefilled
        with the new weights, their later tokens come from the new version (recorded as policy_version_end); with
        none running (abort, drain) the cached prompt prefixes still go. With `keep_kv` (rollout.keep_kv) the
        running requests keep their KV and go on at once; the requests added from now on carry a new cache salt,
        so no prefix cached under the old weights is matched again (it ages out of the cache)."""
        received = sum(self.llm.collective_rpc("asyncrl_receive_weights", args=(payload,)))
        self._loaded(keep_kv)
        return received

    def fingerprint(self) -> dict | None:
        """Fingerprints of the weights served now (asyncrl.core.fingerprint), by checkpoint name; None with tensor
        parallelism (each worker holds a shard; not implemented)."""
        if self.tensor_parallel_size > 1:
            return None
        return self.llm.collective_rpc("asyncrl_fingerprint")[0]

    def load_weights(self, weights: list[tuple[str, object]], keep_kv: bool = False) -> None:
        """Load checkpoint-named tensors given in this process (offline evaluation, benchmarks); `keep_kv` as in
        `receive_weights`."""
        self.llm.collective_rpc("asyncrl_load_weights", args=(weights,))
        self._loaded(keep_kv)

    def _loaded(self, keep_kv: bool) -> None:
        if keep_kv:
            self.kv_kept_loads += 1
            self.salt = f"asyncrl-load-{self.kv_kept_loads}"
        else:
            self.engine.reset_prefix_cache(reset_running_requests=True)

    def shutdown(self) -> None:
        """Nothing to stop: the in-process engine goes with its actor."""

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        from vllm import SamplingParams

        self._on_engine_threads()
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        outs = self.llm.generate([self._prompt(p) for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def sequence_logprobs(self, token_ids: list[int], temperature: float) -> list[float]:
        """Log-probs the engine assigns to token_ids[1:] given their prefixes."""
        from vllm import SamplingParams

        self._on_engine_threads()
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=temperature)
        out = self.llm.generate(self._prompt(token_ids), params, use_tqdm=False)[0]
        return [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], token_ids[1:])]
