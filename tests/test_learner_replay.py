"""bench/learner_replay.py: a run's batches replayed through a learner alone, and its table (a written run directory
of the random tiny model; no Ray, no engine)."""
import json
from pathlib import Path

import yaml

from asyncrl.core.config import load_config
from asyncrl.core.schema import Status, new_sample
from asyncrl.core.store import TrajectoryStore
from tests.bench_modules import load


def _module():
    return load("learner_replay")


def _run_dir(tmp_path: Path, model: str) -> Path:
    """Two steps of two groups of 2 consumed samples each, and a dropped group the replay must not train on."""
    run = tmp_path / "run"
    cfg = load_config(None, [f"model.path={model}", "rollout.group_size=2", "learner.batch_size=4", "learner.torch_threads=1"])
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    store = TrajectoryStore(run / "trajectories")
    for step in (0, 1):
        for g in range(2):
            store.append([new_sample(sample_id=f"s{step}-{g}-{i}", group_id=f"g{step}-{g}", prompt_ids=[5, 6, 7], response_ids=[8, 9 + i],
                                     behavior_logprobs=[-2.0, -2.0], reward=float(i), policy_version_start=step, policy_version_end=step,
                                     finish_reason="stop", status=Status.CONSUMED.value, consumed_step=step, consumed_version=step)
                          for i in range(2)])
    store.append([new_sample(sample_id="late-0", group_id="late", prompt_ids=[5], response_ids=[8], behavior_logprobs=[-2.0],
                             status=Status.DROPPED_STALE.value)])
    store.flush()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time/learner_compute_s": 2.0 + s}) + "\n" for s in (0, 1)))
    return run


def test_replay_trains_each_steps_consumed_batch_in_order_against_its_time_in_the_run(tmp_path, random_model_dir):
    rows = _module().replay(str(_run_dir(tmp_path, random_model_dir)))
    assert [(r["step"], r["samples"], r["in_run_s"], r["threads"]) for r in rows] == [(0, 4, 2.0, 1), (1, 4, 3.0, 1)]
    assert all(r["alone_s"] > 0 for r in rows)


def test_render_gives_each_sides_ratio_over_the_steps_after_the_first():
    steps = [{"step": 0, "samples": 16, "alone_s": 1.0, "in_run_s": 5.0}, {"step": 1, "samples": 16, "alone_s": 1.0, "in_run_s": 1.2},
             {"step": 2, "samples": 16, "alone_s": 2.0, "in_run_s": 2.8}]
    side = {"config": "configs/x.yaml", "batch": 16, "threads": 2, "pinned": [], "steps": steps, "ratio": 1.3,
            "in_run_per_sample_s": 4.0 / 32, "alone_per_sample_s": 3.0 / 32}
    text = _module().render({"samples": 32, "seed": 0, "sides": [side]})
    assert "| `x.yaml` | 2 threads, not pinned, batch 16 | 0.125 | 0.094 | **1.30x** (1.20–1.40) |" in text
