"""The elastic rollout pool: its decisions (pure), the run's mailbox, the totals a removed worker leaves behind, the
config's bounds; and, slow, a run that goes from one rollout worker to two and back to one, asked with
`asyncrl scale` while it trains."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl.actors.control import RunControl
from asyncrl.core.config import ConfigError, load_config
from asyncrl.core.elastic import Bounds, autoscale_target, target_error
from asyncrl.core.messages import WorkerStats
from asyncrl.core.store import read_trajectories
from asyncrl.orchestration.pools import RolloutPool
from asyncrl.orchestration.step_metrics import rollout_metrics

ROOT = Path(__file__).resolve().parents[1]
BOUND = 3  # buffer.max_staleness of the slow run


def test_a_size_outside_the_bounds_is_refused_naming_the_bound():
    assert target_error(3, Bounds(1, 4)) is None and target_error(1, Bounds(1, None)) is None
    assert target_error(0, Bounds(1, 4)) == "0 rollout workers is below rollout.min_workers=1"
    assert target_error(5, Bounds(1, 4)) == "5 rollout workers is above the most allowed, 4 (rollout.max_workers)"
    assert target_error(50, Bounds.of(1, 0)) is None  # 0: no bound but the cluster's
    fixed = Bounds.of(1, 0, endpoint_port=8000)  # one worker per fixed agent endpoint port
    assert "env.endpoint_port=8000" in target_error(2, fixed)


def test_the_autoscaler_follows_the_verdict_within_the_bounds():
    b = Bounds(1, 3)
    assert autoscale_target("generation-bound", 1, b) == 2
    assert autoscale_target("generation-bound", 3, b) == 3  # at the top
    assert autoscale_target("training-bound", 2, b) == 1
    assert autoscale_target("training-bound", 1, b) == 1  # at the bottom
    assert autoscale_target("balanced", 2, b) == 2 and autoscale_target("reward-bound", 2, b) == 2


def test_the_mailbox_keeps_the_last_size_asked_for_once_and_refuses_one_out_of_bounds():
    control = RunControl("demo", Bounds(1, 3))
    assert control.take() is None
    control.report({"serving": 1, "starting": 0})
    assert "asked for 2 rollout workers (serving 1)" in control.request(2)
    control.request(3)
    assert control.state()["asked"] == 3 and control.take() == 3 and control.take() is None
    with pytest.raises(ValueError, match="run demo: 4 rollout workers is above the most allowed, 3"):
        control.request(4)
    assert control.take() is None


def test_config_bounds_are_checked_at_load():
    load_config(None, ["rollout.num_workers=2", "rollout.max_workers=3", "rollout.autoscale=true"])
    with pytest.raises(ConfigError, match="rollout.num_workers"):
        load_config(None, ["rollout.num_workers=4", "rollout.max_workers=3"])
    with pytest.raises(ConfigError, match="rollout.max_workers"):
        load_config(None, ["rollout.min_workers=3", "rollout.max_workers=2", "rollout.num_workers=3"])
    with pytest.raises(ConfigError, match="rollout.autoscale.*needs rollout.max_workers"):
        load_config(None, ["rollout.autoscale=true"])


def test_a_removed_workers_counters_stay_in_the_run_totals_but_not_in_the_rates():
    live = WorkerStats(worker_id=0, groups_done=5, busy_s=10.0, idle_s=1.0, tokens=100, turns=3)
    gone = WorkerStats(worker_id=1, groups_done=4, busy_s=8.0, idle_s=0.0, tokens=80, turns=2, inflight_groups=0)
    buffer = {"lost": 0, "buffered_groups": 0, "refused_admissions": 0, "dropped_stale": 0, "dropped_error": 0, "filtered": 0, "consumed": 0,
              "expiring_wait_s": 0.0, "expiring_wait_batches": 0}
    metrics, seen = rollout_metrics([live], buffer, {}, 1.0, 0, 4, gone=[gone])
    assert metrics["samples/generated_total"] == (5 + 4) * 4 and metrics["rollout/busy_s_total"] == 18.0
    assert metrics["rollout/turns_total"] == 5 and metrics["rollout/tokens_per_s"] == 100.0
    assert "rollout/w1/tokens_per_s" not in metrics and set(seen) == {0}


def test_a_removed_worker_keeps_its_prompt_cursor_in_the_checkpoint():
    pool = RolloutPool.__new__(RolloutPool)  # the bookkeeping only: no Ray
    pool.workers = [object()]  # worker 1 left after drawing 7 prompts in this process (3 before it, a resumed run)
    pool.cursors, pool.cursor_offsets = {0: 10, 1: 3}, {1: 7}
    assert pool.prompt_cursors([WorkerStats(worker_id=0, prompts_drawn=5)]) == {"0": 15, "1": 10}


# ---- slow: the pool changes while a run trains --------------------------------------------------------

def metric_rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def wait_for(what, out: Path, proc: subprocess.Popen, timeout_s: float = 300) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = metric_rows(out)
        if what(rows):
            return rows
        assert proc.poll() is None, f"the run ended first: {proc.stdout.read()[-3000:]}"
        time.sleep(0.3)
    raise AssertionError(f"timed out; last rows: {metric_rows(out)[-2:]}")


def command(name: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    """`asyncrl scale|stop RUN_DIR ...`, as a user types it in another shell."""
    return subprocess.run([str(Path(sys.executable).parent / "asyncrl"), name, str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def scale(out: Path, *args: str) -> subprocess.CompletedProcess:
    return command("scale", out, *args)


@pytest.mark.slow
def test_one_to_two_to_one_rollout_workers_mid_run_loses_nothing_and_keeps_the_bound(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={out}", f"model.path={tiny_model_dir}",
           "run.steps=200", "run.eval=false", "rollout.max_workers=2", "rollout.num_cpus=0.5", "learner.delay_s=0.3",
           "rollout.max_new_tokens=16", "run.checkpoint_every=0", f"buffer.max_staleness={BOUND}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda rows: len(rows) >= 2, out, proc)
        refused = scale(out, "3")  # above rollout.max_workers: refused to the asker, the run goes on
        assert refused.returncode == 2 and "3 rollout workers is above the most allowed, 2 (rollout.max_workers)" in refused.stderr
        asked = scale(out, "2")
        assert asked.returncode == 0, asked.stderr
        # a new engine is slow on its first requests: its first groups may go stale; wait until it generates
        grown = wait_for(lambda rows: sum(r.get("rollout/workers") == 2 and r.get("rollout/w1/tokens_per_s", 0) > 0 for r in rows) >= 3, out, proc)
        joined_at = next(r["step"] for r in grown if r.get("rollout/workers") == 2)
        assert json.loads(scale(out).stdout)["serving"] == 2
        assert scale(out, "1").returncode == 0
        shrunk = wait_for(lambda rows: sum(r.get("rollout/workers") == 1 for r in rows[joined_at:]) >= 3, out, proc)
        left_at = next(r["step"] for r in shrunk[joined_at:] if r.get("rollout/workers") == 1)
        stopped = command("stop", out)
        assert stopped.returncode == 0, stopped.stderr
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    assert "rollout pool 1 -> 2 workers (command)" in output and "rollout pool 2 -> 1 workers (command)" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "command" and summary["steps"] < 200 and summary["rollout_workers"] == 1
    changes = summary["pool_changes"]
    assert [(c["before"], c["after"], c["error"]) for c in changes] == [(1, 2, None), (2, 1, None)], changes
    assert summary["samples"]["lost"] == 0 and summary["samples"]["dropped_error"] == 0
    rows = metric_rows(out)
    versions = [r["policy_version"] for r in rows]
    assert versions == list(range(1, len(rows) + 1)), versions  # one version per step (sync_every=1), none skipped
    assert any(r["time/pool_change_s"] > 0 for r in rows)
    records = read_trajectories(out / "trajectories").to_pylist()
    assert len(records) == summary["samples"]["rows_written"]
    ids = [r["sample_id"] for r in records]
    assert len(ids) == len(set(ids)), "a sample recorded twice"
    by_worker = {w: [r for r in records if r["worker_id"] == w] for w in (0, 1)}
    assert any(r["status"] == "consumed" for r in by_worker[1]), "the added worker's samples were never trained on"
    assert not [r for r in records if r["status"] == "dropped_error"], "a group was lost to the pool's changes"
    assert all(r["status"] in {"consumed", "filtered", "unconsumed_at_end", "aborted_at_end", "dropped_stale"} for r in records)
    for r in records:
        if r["status"] == "consumed":  # the staleness bound held for every trained sample
            assert r["consumed_version"] - r["policy_version_start"] <= BOUND, r
    # the added worker generated only between its join and its removal, with the weights of that time
    steps_of_1 = sorted(r["consumed_step"] for r in by_worker[1] if r["status"] == "consumed")
    # (what it delivered before leaving may wait in the buffer up to the staleness bound before it is trained on)
    assert joined_at - 1 <= steps_of_1[0] and steps_of_1[-1] <= left_at + 1 + BOUND, (joined_at, left_at, steps_of_1[:3], steps_of_1[-3:])


def test_the_autoscaler_is_asked_once_a_window_and_never_during_a_change():
    from types import SimpleNamespace

    from asyncrl.core.elastic import PoolChange
    from asyncrl.orchestration.elastic import RunCommands

    asked = []
    pool = SimpleNamespace(busy=False, changes=[], workers=[object()], bounds=Bounds(1, 3),
                           want=lambda n, step, why: asked.append((n, step, why)))
    commands = RunCommands.__new__(RunCommands)  # only the decision: no Ray, no actors
    commands.cfg = load_config(None, ["rollout.max_workers=3", "rollout.autoscale=true", "rollout.autoscale_window=3"])
    commands.pool = pool
    waiting = {"time/step_s": 1.0, "time/learner_wait_s": 0.8, "rollout/idle_frac": 0.0}  # the learner waits for data
    commands.autoscale(1, [waiting] * 2)
    assert asked == []  # fewer steps than the window
    commands.autoscale(2, [waiting] * 3)
    assert asked == [(2, 2, "autoscale: generation-bound")]
    pool.busy = True
    commands.autoscale(3, [waiting] * 4)
    assert len(asked) == 1  # a change under way: not judged
    pool.busy, pool.changes, pool.workers = False, [PoolChange(2, 1, 2, "autoscale", done_step=4)], [object(), object()]
    commands.autoscale(5, [waiting] * 6)
    assert len(asked) == 1  # within a window of the last change
    idle = {"time/step_s": 1.0, "time/learner_wait_s": 0.0, "rollout/idle_frac": 0.9}  # rollouts wait for admission
    commands.autoscale(7, [waiting] * 5 + [idle] * 3)
    assert asked[-1] == (1, 7, "autoscale: training-bound")
