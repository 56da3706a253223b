"""bench/agentic.py's pure parts: the synchronous baseline's overrides, episode shapes, the comparison (which fails
on an impossible figure) and the table made from a result alone."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import agentic  # noqa: E402

from asyncrl.core.config import load_config  # noqa: E402


def mode(step_s: float, batch: int, wait: float = 0.2) -> dict:
    lengths = {"samples": 10, "mean": 20.0, "max": 40, "p50": 18, "p90": 30, "p99": 40, "finish_reasons": {"stop": 9, "length": 1}}
    return {"step_s": step_s, "learner_wait_frac": wait, "rollout_idle_frac": 0.3, "batch_size": batch, "tool_calls": 12,
            "tool_s_mean": 0.12, "tool_errors": 0, "lengths": lengths, "episodes": 10, "turns": {1: 4, 2: 6}, "observations": {0: 4, 1: 6}}


def test_the_default_baseline_is_the_job_made_synchronous_and_colocated():
    cfg = load_config(None, ["learner.batch_size=32", "rollout.group_size=8"])
    overrides = agentic.colocated_sync(cfg)
    sync = load_config(None, ["learner.batch_size=32", "rollout.group_size=8", *overrides])
    assert sync.buffer.max_staleness == 0 and sync.rollout.max_inflight_groups == 4  # the whole batch at once
    assert sync.rollout.cpu_affinity == [] and sync.learner.cpu_affinity == []


def test_episode_shapes_count_model_turns_and_observations_of_ended_episodes():
    model, obs = {"role": "model"}, {"role": "observation"}
    rows = [{"turns": [model, obs, model], "status": "consumed"}, {"turns": [model], "status": "dropped_error"},
            {"turns": [model, obs], "status": "aborted_at_end"}, {"turns": [], "status": "dropped_error"}]
    assert agentic.episode_shape(rows) == {"episodes": 2, "turns": {1: 1, 2: 1}, "observations": {0: 1, 1: 1}}


def test_the_speedup_is_episodes_per_second_of_each_modes_own_batch_and_impossible_figures_fail():
    got = agentic.compare(mode(2.0, 64), mode(0.4, 16))
    assert got == pytest.approx({"sync_episodes_per_s": 32.0, "async_episodes_per_s": 40.0, "speedup": 1.25})
    with pytest.raises(SystemExit, match="impossible figure"):
        agentic.compare(mode(2.0, 64, wait=1.3), mode(0.4, 16))


def test_the_table_is_made_from_the_result_alone():
    result = {"config": "configs/smollm2_function_calling.yaml", "sync_name": "smollm2_function_calling_sync.yaml", "env": None,
              "agent": "tests.agents_fixture.slow_function_calling", "steps": 8, "async_max_staleness": 3, "tool_workers": 16,
              "argv": ["--steps", "8"], "sync": mode(2.0, 64), "async": mode(0.4, 16), **agentic.compare(mode(2.0, 64), mode(0.4, 16))}
    text = agentic.render(result)
    assert "agent `tests.agents_fixture.slow_function_calling`" in text and "| **speedup** | | **1.25x** |" in text
    assert "| batch, step time | 64, 2.00 s | 16, 0.40 s |" in text and "agent's events (its first request, each request after a tool's result, its end" in text
    assert "| observations per episode | 0: 40%, 1: 60% |" in text
