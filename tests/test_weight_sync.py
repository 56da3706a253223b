"""Weights arrive: after a broadcast over the real gloo group, the engine (vLLM, and SGLang joined with its own
`init_weights_update_group`) scores a fixed sequence exactly as the learner does, and differently from before;
the learner may train on while a version is in flight without changing what the engine receives."""
import pytest
import ray

from asyncrl.actors.learner import Learner
from asyncrl.core.config import load_config
from asyncrl.core.models.cache import ModelSource
from asyncrl.orchestration.controller import Controller
from tests.test_learner import fake_samples

TOLERANCE = 1e-3
"""Largest |engine - learner| log-prob on SEQ, both in float32 (measured 2.4e-7 to 4.8e-7 for either engine, before and after the sync)."""
SEQ = [1, 4, 6, 13, 5, 8, 14, 7, 9, 2]  # "<s>13+25=46</s>" in the tiny tokenizer's ids


# learner world 1's sync is checked value for value on every vLLM engine of tests/test_weight_verify.py too
@pytest.mark.parametrize("engine, world", [pytest.param("vllm", 1, marks=pytest.mark.extended), ("vllm", 2), pytest.param("sglang", 1, marks=pytest.mark.slow),
                                           pytest.param("sglang", 2, marks=pytest.mark.extended)], ids=["vllm-1", "vllm-2", "sglang-1", "sglang-2"])
def test_broadcast_reaches_the_engine(ray_local, random_model_dir, tmp_path, engine, world):
    """At learner world 2 the weights are gathered from two FSDP2 ranks' shards bucket by bucket."""
    cfg = load_config(None, [f"rollout.engine={engine}", f"learner.num_workers={world}", f"learner.num_cpus={1 / world}",
        "rollout.group_size=4", "learner.batch_size=16", "learner.lr=1e-2", "learner.sync_bucket_mb=0.05",
        "logging.wandb=false", f"run.output_dir={tmp_path}",
    ])
    ctl = Controller(cfg, tmp_path, ModelSource(given=random_model_dir, path=random_model_dir))
    try:
        engine_before = ray.get(ctl.workers[0].sequence_logprobs.remote(SEQ))
        learner_before = ctl.on_learners("sequence_logprobs", SEQ)  # a collective at world 2
        assert max(abs(a - b) for a, b in zip(engine_before, learner_before)) < TOLERANCE  # same start

        ctl.on_learners("train_step", fake_samples(), 0)
        learner_after = ctl.on_learners("sequence_logprobs", SEQ)
        sync = ctl.sync_weights()  # posts the version and returns: the engine loads it meanwhile
        ctl.on_learners("train_step", fake_samples(), 1)  # the next step changes the weights at once
        assert ctl.settle_weights()["load_s"] > 0
        engine_after = ray.get(ctl.workers[0].sequence_logprobs.remote(SEQ))

        assert max(abs(a - b) for a, b in zip(engine_after, learner_after)) < TOLERANCE
        assert max(abs(a - b) for a, b in zip(engine_after, engine_before)) > 1e-3
        n_params = sum(p.numel() for p in Learner(cfg, random_model_dir).model.parameters())
        assert sync["bytes"] == 4 * n_params  # every fp32 weight, in several 50 KiB buckets
        assert ray.get(ctl.workers[0].stats.remote()).version == 1
    finally:
        ctl.shutdown()
