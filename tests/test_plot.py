"""asyncrl.plot on a synthetic run directory (no Ray, no model): fast."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.analysis.runs import load_run
from asyncrl.plot import FIGURES, consumed_staleness, length_figure, main, make_plots, running_figure, timeline_figure
from asyncrl.core.schema import new_sample
from asyncrl.core.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T0 = 1_700_000_000.0
STEPS = 4


def metric_row(step: int) -> dict:
    start = T0 + 1.0 + step
    return {
        "step": step, "policy_version": step, "reward/mean": 0.4 + 0.1 * step, "reward/std": 0.2,
        "kl/ref": 0.01 * step, "kl/ref_k1": 0.012 * step, "kl/ref_k2": 0.011 * step, "kl/ref_k3": 0.01 * step,
        "kl/behavior": 0.001, "is_ratio/mean": 1.0, "is_ratio/max": 1.5 + step, "is_ratio/min": 0.5,
        "staleness/mean": 0.5, "staleness/max": 1, "time/step_s": 0.6, "time/learner_wait_s": 0.05,
        "time/weight_sync_s": 0.01, "rollout/idle_frac": 0.1, "time/train_start": start, "time/train_end": start + 0.5,
        **({"eval/accuracy": 0.3 + 0.1 * step, "eval/pass_at_1": 0.25, "eval/pass_at_k": 0.5} if step % 2 else {}),  # run.eval_every=2
    }


def samples() -> list[dict]:
    rows = []
    for step in range(STEPS):
        for i in range(4):
            start = max(step - (i % 2), 0)
            rows.append(new_sample(
                run_id="r", sample_id=f"s{step}-{i}", group_id=f"g{step}", prompt_id=f"p{step}", worker_id=i % 2,
                prompt_text="1+2=", response_text="3", reward=1.0, status="consumed", policy_version_start=start,
                response_ids=[5] * (2 + i), finish_reason="length" if i == 3 else "stop",
                policy_version_end=start, consumed_version=step, consumed_step=step,
                t_submitted=T0 + step, t_generated=T0 + step + 0.25 * i + 0.1,
            ))
    rows.append(new_sample(run_id="r", sample_id="stale", worker_id=0, status="dropped_stale",
                           policy_version_start=0, t_submitted=T0, t_generated=T0 + 2.2))
    rows.append(new_sample(run_id="r", sample_id="aborted", worker_id=1, status="aborted_at_end", t_submitted=T0 + 4))
    return rows


def write_run(path: Path, with_trajectories: bool = True, torn_tail: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(metric_row(s)) + "\n" for s in range(STEPS))
    (path / "metrics.jsonl").write_text(text + ('{"step": 4, "rew' if torn_tail else ""))
    trace = [{"step": s, "worker": w, "t": [T0 + s + 0.1 * k for k in range(5)], "running": [8, 8, 6, 2, 1]}
             for s in range(STEPS) for w in (0, 1)]
    (path / "engine_trace.jsonl").write_text("".join(json.dumps(row) + "\n" for row in trace))
    if with_trajectories:
        store = TrajectoryStore(path / "trajectories")
        store.append(samples())
        store.flush()
    return path


def assert_pngs(paths: list[Path], names: set[str]) -> None:
    assert {p.name for p in paths} == names
    for p in paths:
        data = p.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), p


def test_every_plot(tmp_path):
    run_dir = write_run(tmp_path / "run")
    paths = make_plots(run_dir)
    assert all(p.parent == run_dir / "plots" for p in paths)
    assert_pngs(paths, set(FIGURES))


def test_staleness_and_timeline_read_the_trajectories(tmp_path):
    run = load_run(write_run(tmp_path / "run"))
    stale = consumed_staleness(run)
    assert len(stale) == 4 * STEPS and set(stale) == {0, 1}
    ax = timeline_figure(run).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["learner", "rollout w0", "rollout w1"]
    assert ax.get_xlim()[0] <= 0.0  # seconds since the earliest timestamp


def test_running_requests_and_lengths_figures(tmp_path):
    run = load_run(write_run(tmp_path / "run"))
    ax = running_figure(run).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"rollout w0", "rollout w1"}
    assert list(lines["rollout w0"].get_ydata()) == [8, 8, 6, 2, 1] * STEPS  # every engine step, in order
    ax = length_figure(run).axes[0]
    heights = [sum(p.get_height() for p in container) for container in ax.containers]
    assert heights == [3 * STEPS, STEPS]  # stacked: the EOS ones, and the cut ones (one of each group of 4) on top


def test_run_killed_without_trajectories_still_plots_metrics(tmp_path):
    # no summary.json, no trajectories/, a torn last metrics line
    run_dir = write_run(tmp_path / "killed", with_trajectories=False, torn_tail=True)
    paths = make_plots(run_dir, tmp_path / "out")
    assert all(p.parent == tmp_path / "out" for p in paths)
    # staleness falls back to staleness/mean, timeline to learner windows; no lengths without trajectories
    assert_pngs(paths, set(FIGURES) - {"lengths.png"})


def test_missing_metrics_keys_are_skipped(tmp_path):
    run_dir = tmp_path / "sparse"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.5}) + "\n")
    assert_pngs(make_plots(run_dir), {"reward.png"})


def test_cli_prints_paths(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run")
    assert main([str(run_dir), "--out", str(tmp_path / "png")]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == sorted(str(tmp_path / "png" / name) for name in FIGURES)


def test_cli_exits_2_on_a_missing_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "asyncrl.plot", str(tmp_path / "nope")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "nope" in proc.stderr


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_empty_run_gives_no_figure(tmp_path, name):
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")
    assert FIGURES[name](load_run(run_dir)) is None
