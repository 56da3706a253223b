"""Verified syncs on the real path: learner, gloo group, vLLM engines in their Ray actors. After every load each
engine fingerprints what it serves (its linear layers through its own repacked kernels) and the learner compares:
a clean sync matches, and a tensor garbled on one engine, or a LoRA merge that never reached the engine, is an error
naming the engine, the version and the tensor; `learner.on_weight_mismatch` decides what follows."""
import time

import pytest
import ray

from asyncrl.core.config import load_config
from asyncrl.core.deadlines import StageTimeout
from asyncrl.core.fingerprint import WeightMismatch
from asyncrl.core.models.cache import ModelSource
from asyncrl.orchestration.controller import Controller
from tests.test_learner import fake_samples

GARBLED = "model.layers.1.self_attn.k_proj.weight"  # inside vLLM's fused qkv_proj


def _garble_loads(actor, name: str, times: int) -> None:
    """In a rollout worker's process: the next `times` loads (-1: every one, 0: none any more) get `name` scaled by
    1.5 (a garbled tensor)."""
    import asyncrl.actors.vllm_ext as ext

    real = ext.__dict__.setdefault("_unpatched_reload_units", ext.reload_units)
    left = [times]

    def garbled(runner, weights, units):
        if left[0] != 0:
            left[0] -= 1
            weights = [(n, t * 1.5 if n == name else t) for n, t in weights]
        return real(runner, weights, units)

    ext.reload_units = garbled


def _drop_loads(actor, names: list[str]) -> None:
    """In a rollout worker's process: loads leave out `names` (a LoRA merge that never reaches the engine)."""
    import asyncrl.actors.vllm_ext as ext

    real = ext.reload_units
    ext.reload_units = lambda runner, weights, units: real(runner, [(n, t) for n, t in weights if n not in names], units)


def _controller(tmp_path, model_dir, *sets):
    cfg = load_config(None, ["rollout.num_workers=2", "rollout.num_cpus=0.5", "learner.num_cpus=0.5", "rollout.group_size=4",
                             "learner.batch_size=16", "learner.lr=1e-2", "logging.wandb=false", f"run.output_dir={tmp_path}", *sets])
    return Controller(cfg, tmp_path, ModelSource(given=model_dir, path=model_dir))


def _train_and_sync(ctl, step: int) -> dict:
    ctl.on_learners("train_step", fake_samples(), step)
    ctl.sync_weights()
    return ctl.settle_weights()


def test_verification_names_engine_version_and_tensor_and_follows_the_configured_action(ray_local, random_model_dir, tmp_path):
    """One run, four syncs: clean; garbled on engine 1 with `stop`; then `replace`; then `resend` (the action is
    switched on the fleet between syncs, as the config would set it, to start the engines once)."""
    ctl = _controller(tmp_path, random_model_dir, "learner.on_weight_mismatch=stop")
    fleet = ctl.fleet
    try:
        settled = _train_and_sync(ctl, 0)
        assert settled["verified"] == 1.0 and settled["mismatches"] == 0 and settled["verify_s"] > 0

        ray.get(ctl.workers[1].__ray_call__.remote(_garble_loads, GARBLED, -1))
        with pytest.raises(WeightMismatch) as err:
            _train_and_sync(ctl, 1)
        assert (err.value.engine, err.value.version, err.value.mismatch.name) == (1, 2, GARBLED)
        assert "rollout worker 1" in str(err.value) and "version 2" in str(err.value) and GARBLED in str(err.value)

        fleet.on_mismatch = "replace"  # engine 1 still garbles every load: it is swapped for a new one
        settled = _train_and_sync(ctl, 2)
        assert fleet.rollout.restarts == 1 and fleet.mismatches == 2
        assert settled["verified"] == 1.0  # the replacement serves the version as sent
        assert ray.get(ctl.workers[1].stats.remote()).version == 3

        fleet.on_mismatch = "resend"
        ray.get(ctl.workers[0].__ray_call__.remote(_garble_loads, GARBLED, 1))  # the next load only
        settled = _train_and_sync(ctl, 3)
        assert settled["mismatches"] == 1 and settled["verified"] == 1.0  # sent again, then served right
        ray.get(ctl.workers[0].__ray_call__.remote(_garble_loads, GARBLED, -1))  # every load
        with pytest.raises(WeightMismatch, match="sent a second time"):
            _train_and_sync(ctl, 4)
    finally:
        ctl.shutdown()


def test_a_lora_merge_that_never_reaches_the_engine_is_caught(ray_local, random_model_dir, tmp_path):
    ctl = _controller(tmp_path, random_model_dir, "learner.lora.rank=4", "learner.lora.alpha=8",
                      "learner.lora.target_modules=[q_proj, down_proj]", "learner.on_weight_mismatch=stop")
    try:
        sent = [name for name, _, _ in ray.get(ctl.learner.weight_meta.remote())]
        assert any(".q_proj." in n for n in sent)
        ray.get(ctl.workers[0].__ray_call__.remote(_drop_loads, [n for n in sent if ".q_proj." in n]))
        with pytest.raises(WeightMismatch) as err:
            _train_and_sync(ctl, 0)
        assert err.value.engine == 0 and ".q_proj." in err.value.mismatch.name
    finally:
        ctl.shutdown()


def _freeze_in_load(actor) -> None:
    """In a rollout worker's process: its next load stops the process (SIGSTOP) once the weights have arrived."""
    import os
    import signal

    import asyncrl.actors.vllm_ext as ext

    real = ext.reload_units

    def frozen(runner, weights, units):
        os.kill(os.getpid(), signal.SIGSTOP)
        return real(runner, weights, units)

    ext.reload_units = frozen


def _freeze_before_receive(actor) -> None:
    """In a rollout worker's process: its next load stops the process (SIGSTOP) before it takes the broadcast."""
    import os
    import signal

    from asyncrl.core import weights

    real = weights.BroadcastReceiver.receive

    def frozen(self, payload):
        os.kill(os.getpid(), signal.SIGSTOP)
        return real(self, payload)

    weights.BroadcastReceiver.receive = frozen


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory) -> str:
    """An untrained Qwen2 of about 20 M parameters: a sync (40 MB in bf16) is more than the sockets buffer, so the
    learner's broadcast waits on an engine that does not take it."""
    from asyncrl.core.models.tiny import TinySpec, build_model, build_tokenizer, save_tokenizer

    out = tmp_path_factory.mktemp("wide_model")
    tokenizer = build_tokenizer()
    build_model(TinySpec(hidden_size=512, num_heads=8, intermediate_size=1536, num_layers=6), len(tokenizer)).save_pretrained(out)
    save_tokenizer(tokenizer, out)
    return str(out)


def test_the_watchdog_replaces_an_engine_frozen_in_a_load_and_stops_on_a_learner_frozen_mid_step(ray_local, wide_model_dir, tmp_path):
    """The watchdog's first deadline is run.hang_first_s (20 s here): the frozen engine is named, replaced, and the
    replacement loads the version. An engine frozen before it takes the broadcast holds up the learner's send: past
    the send's deadline it is found not answering, named, replaced, and every engine gets the version. Then a learner
    rank frozen as its step begins stops the run, named, within the deadline its earlier steps set (at least
    run.hang_floor_s)."""
    ctl = _controller(tmp_path, wide_model_dir, "run.hang_first_s=20", "run.hang_floor_s=5", "learner.sync_bucket_mb=4")
    try:
        ray.get(ctl.workers[1].__ray_call__.remote(_freeze_in_load))
        ctl.on_learners("train_step", fake_samples(), 0)
        ctl.sync_weights()
        settled = ctl.settle_weights()
        [report] = ctl.fleet.watchdog
        assert report.startswith("rollout worker 1 did not finish update_weights (receiving and loading version 1) in 2")
        assert "the deadline was 20 s (run.hang_first_s: weight load not timed yet)" in report
        assert ctl.fleet.rollout.restarts == 1 and settled["verified"] == 1.0
        assert ray.get(ctl.workers[1].stats.remote()).version == 1
        _train_and_sync(ctl, 1)  # the next sync's deadline comes from the loads measured: 5 s at least
        assert ctl.fleet.sync.clock.deadline("weight load") >= 5 and len(ctl.fleet.watchdog) == 1

        ray.get(ctl.workers[0].__ray_call__.remote(_freeze_before_receive))
        ctl.on_learners("train_step", fake_samples(), 2)
        send_deadline = ctl.fleet.sync.clock.deadline("weight send")
        t0 = time.monotonic()
        ctl.sync_weights()  # the replacement gets the version in place, settled (nothing is left in flight)
        assert ctl.fleet.sync.in_flight is None and time.monotonic() - t0 < send_deadline + 5 + 60  # the deadline, the probe, the replacement's start
        report = ctl.fleet.watchdog[1]
        assert report.startswith("rollout worker 0 did not finish update_weights (version 3 not received: the learner's broadcast waited on it; it did not answer a stats call in 5 s)"), report
        assert ctl.fleet.rollout.restarts == 2 and ctl.fleet.mismatches == 0
        assert [ray.get(w.stats.remote()).version for w in ctl.workers] == [3, 3]

        ray.get(ctl.learner.__ray_call__.remote(_freeze_next_step))
        deadline = ctl.fleet.learner_pool.clock.deadline("train_step")
        t0 = time.monotonic()
        with pytest.raises(StageTimeout, match=r"^learner rank 0 did not finish train_step in \d+ s: the deadline was \d+ s \(10 x its longest"):
            ctl.on_learners("train_step", fake_samples(), 3)
        assert deadline <= time.monotonic() - t0 < deadline + 10
    finally:
        ctl.shutdown()


def _freeze_next_step(learner) -> None:
    """In a learner rank's process: its next train_step stops the process (SIGSTOP) as it begins."""
    import os
    import signal

    learner._ready()
    real = learner.trainer.train_step

    def frozen(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGSTOP)
        return real(*args, **kwargs)

    learner.trainer.train_step = frozen  # the actor's own methods are bound when it starts; its trainer's are not
