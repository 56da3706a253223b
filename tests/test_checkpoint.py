"""Checkpoints: atomic and pruned; the learner continues exactly; a run killed with SIGKILL resumes (filtered groups counted once)."""
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from asyncrl.core.checkpoint import latest_checkpoint, read_state, truncate_metrics, write_checkpoint
from asyncrl.core.config import load_config
from asyncrl.core.messages import GroupId
from asyncrl.core.store import read_trajectories
from asyncrl.core.tasks import make_task
from tests.test_e2e import run_pids, tagged
from tests.test_learner import fake_samples, learner, weights
from tests.test_reward_pool import scoring_children

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoints_are_atomic_pruned_and_latest_is_whole(tmp_path):
    for step in (2, 4, 6):
        write_checkpoint(tmp_path, step, {"next_step": step}, lambda d: (d / "learner.pt").write_text("w"), keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000004", "step-000006"]
    assert latest_checkpoint(tmp_path).name == "step-000006" and read_state(latest_checkpoint(tmp_path)) == {"next_step": 6}

    def crash(directory):  # a crash while writing step 8: the half-written directory is not a checkpoint
        (directory / "learner.pt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, 8, {"next_step": 8}, crash, keep=2)
    assert latest_checkpoint(tmp_path).name == "step-000006"
    (root / "latest").unlink()  # without the pointer, the newest complete one
    assert latest_checkpoint(tmp_path).name == "step-000006"
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_truncate_metrics_keeps_steps_before_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i}) + "\n" for i in range(6)) + '{"step": 6, "tor')
    assert truncate_metrics(path, 4) == 4
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_learner_continues_exactly_from_its_checkpoint(random_model_dir, tmp_path, algorithm):
    original = learner(random_model_dir, f"algorithm.name={algorithm}")
    for _ in range(2):
        original.train_step(fake_samples(), version=0)
    original.save_checkpoint(str(tmp_path))
    resumed = learner(random_model_dir, f"algorithm.name={algorithm}")
    assert resumed.load_checkpoint(str(tmp_path)) == 2
    a = original.train_step(fake_samples(), version=1)
    b = resumed.train_step(fake_samples(), version=1)
    for p, q in zip(weights(original), weights(resumed)):
        assert torch.equal(p, q)  # same weights, same Adam moments, same step count
    assert a["loss/policy"] == b["loss/policy"] and a["kl/ref"] == b["kl/ref"]  # the reference stayed the initial model
    if algorithm == "ppo":
        assert all(torch.equal(p, q) for p, q in zip(weights(original, "critic"), weights(resumed, "critic")))


def test_a_checkpoint_of_another_version_is_refused_by_name(random_model_dir, tmp_path):
    (tmp_path / "learner.pt").write_text("an old whole-model checkpoint")
    with pytest.raises(ValueError, match="has no learner/"):
        learner(random_model_dir).load_checkpoint(str(tmp_path))


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]


@pytest.mark.slow
@pytest.mark.parametrize("scoring", [pytest.param("in_loop", marks=pytest.mark.extended),
                                     pytest.param("reward_pool", marks=pytest.mark.extended),
                                     pytest.param("episodes", marks=pytest.mark.extended), "learner_world2"])
def test_sigkill_mid_run_then_resume(tiny_model_dir, tmp_path, scoring):
    """`episodes`: multi-turn episodes with a tool (env.name), in flight when the driver is killed (10 steps: each
    is slower). `make test` runs `learner_world2` (two FSDP2 learner workers, each writing its shards of the
    checkpoint: the driver's kill and resume are the same for one worker); the others are `extended` (make
    test-all): test_reward_pool covers the pool's exactly-once, test_episodes and test_envs the episodes' records,
    test_learner_continues_exactly_from_its_checkpoint one learner's exact continuation."""
    out = tmp_path / "run"
    steps = 10 if scoring == "episodes" else 16
    pool = {"reward_pool": ["reward.num_workers=2", "reward.num_cpus=0.5", "reward.batch_wait_s=0.05"],
            "episodes": [f"env.name={SCRIPTED_ENV}", "env.max_episode_tokens=40", "rollout.max_new_tokens=8"],
            "learner_world2": ["learner.num_workers=2", "learner.num_cpus=0.5"]}.get(scoring, [])
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={out}", f"model.path={tiny_model_dir}",
           f"run.steps={steps}", "run.checkpoint_every=3", "run.eval=false", "learner.delay_s=0.5", "buffer.store_flush_s=0.2",
           "algorithm.filter_zero_variance=true", *pool]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=tagged(out))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (out / "checkpoints" / "step-000006").is_dir():
        time.sleep(0.2)
    time.sleep(0.7)  # one more step lands after the checkpoint, then the driver dies mid-run
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists()
    if scoring != "in_loop":  # the scoring or tool children (each in its own session) die with their actors
        deadline = time.monotonic() + 20
        while scoring_children(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scoring_children(out) == []
    before_kill = metric_steps(out)
    state = read_state(latest_checkpoint(out))  # read now: the resumed run prunes old checkpoints
    resumed_at = state["next_step"]
    assert resumed_at >= 6 and max(before_kill) >= resumed_at - 1

    res = subprocess.run([sys.executable, "-m", "asyncrl.run", "--resume", str(out), "learner.delay_s=0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_at_step"] == resumed_at and summary["steps"] == steps
    assert metric_steps(out) == list(range(steps))  # steps after the checkpoint were redone once, not logged twice
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    versions = [r["policy_version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] > state["version"]  # versions keep increasing
    records = read_trajectories(out / "trajectories").to_pylist()
    ids = [r["sample_id"] for r in records]
    assert len(ids) == len(set(ids)), "a sample recorded twice"
    attempts = {r["run_id"] for r in records}
    assert len(attempts) == 2  # the resumed attempt's records carry a new run_id
    # the data stream went on from the checkpoint's cursor, not from the start: the resumed attempt's groups are
    # exactly the prompts that follow it (the ones drawn after the checkpoint by the killed attempt are drawn again)
    resumed = [r for r in records if r["run_id"] != records[0]["run_id"]]
    drawn = len({r["group_id"] for r in resumed})
    cfg = load_config(ROOT / "configs" / "smoke.yaml")
    stream = make_task(cfg.task, cfg.run.seed, cfg.data).train_prompts(seed=cfg.run.seed * 1000, start=state["worker_cursors"]["0"])
    assert {r["prompt_id"] for r in resumed} == {p.prompt_id for p in itertools.islice(stream, drawn)}
    # dynamic sampling: every group trained on or filtered exactly once across the kill and the resume
    first_id = records[0]["run_id"]
    first, second = [r for r in records if r["run_id"] == first_id], [r for r in records if r["run_id"] != first_id]
    kept_before = [r for r in first if r["status"] == "consumed" and r["consumed_step"] < resumed_at]
    trained = kept_before + [r for r in second if r["status"] == "consumed"]
    assert len(trained) == steps * 16 == summary["samples"]["consumed"]  # the steps redone after the kill trained new groups
    assert len({r["group_id"] for r in trained}) == steps * 4
    n_filtered = lambda rs: sum(r["status"] == "filtered" for r in rs)  # noqa: E731
    assert summary["samples"]["filtered"] == state["buffer_counts"]["filtered"] + n_filtered(second) > 0
    assert n_filtered(first) >= state["buffer_counts"]["filtered"]
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["group_id"], []).append(r)
    for members in groups.values():
        if any(r["status"] == "filtered" for r in members):  # whole groups, all rewards equal
            assert len(members) == 4 and {r["status"] for r in members} == {"filtered"} and len({r["reward"] for r in members}) == 1


SCRIPTED_ENV = "tests.envs_fixture.ScriptedEnv"


def rollout_worker_pids(out: Path) -> list[int]:
    return list(run_pids(out, ("ray::RolloutWorker",)))


def metric_count(out: Path) -> int:
    return len(metric_steps(out)) if (out / "metrics.jsonl").exists() else 0


def wait_for(cond, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_killed_rollout_worker_then_a_killed_learner_rank_are_recovered_in_place_and_nothing_is_lost(random_model_dir, tmp_path):
    """One run, two faults, each recovered without stopping the run (one run: each costs its start-up). A rollout
    worker is SIGKILLed mid-generation (the untrained model writes long responses): it is replaced, and the samples
    it was generating are recorded `dropped_error`, never lost silently. Once its replacement serves, one of two
    FSDP2 learner ranks is SIGKILLed: the learner group is restored in place from the last checkpoint while the
    rollout side goes on, the steps since are redone, and every step is trained once in the metrics."""
    out, steps = tmp_path / "run", 14
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={out}", f"model.path={random_model_dir}",
           f"run.steps={steps}", "run.eval=false", "rollout.max_new_tokens=48", "run.checkpoint_every=3",
           "learner.num_workers=2", "learner.num_cpus=0.5", "learner.delay_s=0.5", "buffer.store_flush_s=0.2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=tagged(out))
    try:
        wait_for(lambda: metric_count(out) >= 3, "3 steps")
        [worker] = rollout_worker_pids(out)
        os.kill(worker, signal.SIGKILL)  # the engine dies with its worker process, mid-run
        at_worker_kill = metric_count(out)
        wait_for(lambda: [p for p in rollout_worker_pids(out) if p != worker] and metric_count(out) >= at_worker_kill + 2,
                 "the replacement worker and two more steps")
        learners = list(run_pids(out, ("ray::Learner",)))
        assert len(learners) == 2, learners
        os.kill(learners[1], signal.SIGKILL)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    assert "rollout worker 0 died" in output
    assert "LEARNER LOST at step" in output and "restoring the learner group from its last checkpoint (step-" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout_restarts"] == 1 and summary["steps"] == steps
    [restart] = summary["learner_restarts"]
    assert restart["restored_step"] % 3 == 0 and 3 <= restart["restored_step"] <= restart["step"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(steps))  # every step once: the ones after the checkpoint redone
    versions = [r["policy_version"] for r in rows]
    assert versions == sorted(set(versions)) and rows[-1]["learner/restarts_total"] == 1  # versions only go forward
    records = read_trajectories(out / "trajectories").to_pylist()
    ids = [r["sample_id"] for r in records]
    assert len(ids) == len(set(ids)), "a sample recorded twice"
    assert {r["consumed_step"] for r in records if r["status"] == "consumed"} == set(range(steps))
    lost = [r for r in records if "died while generating" in (r["status_reason"] or "")]
    assert all(r["status"] == "dropped_error" for r in lost)
    assert len(lost) == summary["samples"]["lost"] == summary["samples"]["dropped_error"] > 0  # only the dead worker's
    # every group a worker was admitted for ended in the record: the group numbers have no gap
    numbers = sorted({GroupId.parse(r["group_id"]).number for r in records})
    assert numbers == list(range(len(numbers)))


def test_repeated_non_finite_steps_stop_the_run_after_a_checkpoint(tmp_path):
    from asyncrl.core.config import load_config
    from asyncrl.orchestration.controller import Controller

    ctl = Controller.__new__(Controller)  # only the streak logic: no Ray, no actors
    ctl.cfg = load_config(None, ["learner.max_non_finite_steps=3", "learner.mini_batches=2", "learner.batch_size=16",
                                 "rollout.group_size=4"])
    ctl.non_finite_streak = 0
    saved = []
    ctl.checkpoint = lambda next_step: saved.append(next_step) or tmp_path / f"step-{next_step}"
    ctl.check_non_finite(0, {"learner/skipped_updates": 2})
    ctl.check_non_finite(1, {"learner/skipped_updates": 1})  # one of two updates went through: the streak resets
    ctl.check_non_finite(2, {"learner/skipped_updates": 2})
    ctl.check_non_finite(3, {"learner/skipped_updates": 2})
    with pytest.raises(RuntimeError, match="3 steps in a row had only non-finite"):
        ctl.check_non_finite(4, {"learner/skipped_updates": 2})
    assert saved == [5]
