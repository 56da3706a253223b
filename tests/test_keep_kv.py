"""rollout.keep_kv: a load that keeps the running requests' KV (PipelineRL's in-flight update), on a real vLLM engine.

The engine runs in its own Ray actor (as a rollout worker's does) on the untrained tiny model; the load is the
weights it already has (what is loaded does not matter here, what happens to the requests does). Without keep_kv
the running requests are preempted and re-prefilled (vLLM's scheduler counts it); with it they go on unpreempted,
and every request added after the load carries a new cache salt, which vLLM mixes into its prefix-cache block
hashes, so it never matches a prefix the old weights computed."""
from __future__ import annotations

import pytest
import ray

from asyncrl.actors.engines import engine_runtime_env
from asyncrl.core.config import ConfigError, load_config
from asyncrl.orchestration.cluster import ACTOR_ENV

PROMPT = [1] + [4 + i % 10 for i in range(26)]  # 27 tokens of the tiny vocabulary + 24 sampled: within its 64 positions


class Probe:
    """A VLLMEngine and the scheduler state the test reads (vLLM's in-process engine core)."""

    def __init__(self, model_dir: str) -> None:
        from safetensors.torch import load_file
        from pathlib import Path

        from asyncrl.actors.engine import VLLMEngine

        r = load_config(None).rollout
        self.engine = VLLMEngine(model_dir, "float32", 64, 0, r.kv_cache_gib, r.gpu_memory_utilization)
        self.weights = [kv for f in sorted(Path(model_dir).glob("*.safetensors")) for kv in load_file(f).items()]
        self.prompts: dict[str, dict] = {}  # request id -> the prompt vLLM was given
        add = self.engine.engine.add_request

        def recorded(request_id, prompt, *args, **kwargs):
            self.prompts[request_id] = dict(prompt)
            return add(request_id, prompt, *args, **kwargs)
        self.engine.engine.add_request = recorded

    def _scheduler(self):
        return self.engine.engine.engine_core.engine_core.scheduler

    def load_while_running(self, keep_kv: bool) -> dict:
        from vllm import SamplingParams

        params = SamplingParams(temperature=1.0, max_tokens=24, min_tokens=24, logprobs=0)
        self.engine.add("warm", PROMPT, params)  # caches the prompt's blocks, then finishes
        while self.engine.has_unfinished():
            self.engine.step()
        running = [f"r{i}" for i in range(3)]
        for rid in running:
            self.engine.add(rid, PROMPT, params)
        for _ in range(4):
            self.engine.step()
        resets = []
        reset = self.engine.engine.reset_prefix_cache
        self.engine.engine.reset_prefix_cache = lambda *a, **kw: resets.append(kw) or reset(*a, **kw)
        self.engine.load_weights(self.weights, keep_kv=keep_kv)
        self.engine.engine.reset_prefix_cache = reset
        preempted = {rid: req.num_preemptions for req in self._scheduler().requests.values()  # internal ids extend ours
                     for rid in running if req.request_id.startswith(rid)}
        self.engine.add("after", PROMPT, params)
        finished = {}
        while self.engine.has_unfinished():
            finished.update({f.request_id: f for f in self.engine.step()})
        salts = {rid: self.prompts[rid].get("cache_salt") for rid in ["warm", *running, "after"]}
        return {"preempted": preempted, "resets": len(resets), "salts": salts,
                "lengths": {rid: len(finished[rid].token_ids) for rid in running + ["after"]}}


@pytest.fixture(scope="module")
def probe(random_model_dir):
    ray.init(num_cpus=2, runtime_env={"env_vars": ACTOR_ENV}, include_dashboard=False, logging_level="WARNING")
    actor = ray.remote(Probe).options(num_cpus=1, runtime_env=engine_runtime_env("vllm", on_gpu=False)).remote(random_model_dir)
    yield actor
    ray.shutdown()


@pytest.mark.slow
def test_a_load_re_prefills_the_running_requests_by_default(probe):
    got = ray.get(probe.load_while_running.remote(False))
    assert got["resets"] == 1 and sorted(got["preempted"]) == ["r0", "r1", "r2"] and all(n == 1 for n in got["preempted"].values())  # preempted, to be re-prefilled
    assert set(got["salts"].values()) == {None}  # the prefix cache was emptied instead
    assert set(got["lengths"].values()) == {24}


@pytest.mark.slow
def test_keep_kv_lets_the_running_requests_go_on_and_salts_the_new_ones(probe):
    got = ray.get(probe.load_while_running.remote(True))
    assert got["resets"] == 0 and sorted(got["preempted"]) == ["r0", "r1", "r2"] and all(n == 0 for n in got["preempted"].values())  # nothing re-prefilled
    salts = got["salts"]  # the same salt before the load (the prompt's cached blocks shared), a new one after it
    assert salts["warm"] == salts["r0"] == salts["r1"] == salts["r2"] != salts["after"] and salts["after"] is not None
    assert set(got["lengths"].values()) == {24}


def test_keep_kv_needs_keep_and_vllm():
    assert load_config(None, ["rollout.keep_kv=true"]).rollout.keep_kv
    with pytest.raises(ConfigError, match="rollout.keep_kv.*weight_update=keep.*got resume, vllm"):
        load_config(None, ["rollout.keep_kv=true", "rollout.weight_update=resume"])
    with pytest.raises(ConfigError, match="rollout.keep_kv.*got keep, sglang"):
        load_config(None, ["rollout.keep_kv=true", "rollout.engine=sglang"])
