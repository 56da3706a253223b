"""The reward pool: RewardWorker actors between the rollout workers and a real ReplayBuffer, on a local Ray cluster.

Groups are handed over as a rollout worker hands them (records + the prompt); what reaches the buffer and the
trajectory store is checked, with the scoring child's process checked by pid."""
from __future__ import annotations

import json
import os
from collections import Counter
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from asyncrl.actors.buffer import ReplayBuffer
from asyncrl.actors.reward import RewardWorker
from asyncrl.core.config import load_config
from asyncrl.core.messages import GroupId
from asyncrl.core.schema import new_sample
from asyncrl.core.store import read_trajectories
from asyncrl.core.prompts import Prompt
from tests.test_e2e import ROOT, RUN_TAG, actor_processes, tagged
from tests.test_scoring import alive

GROUP = 4


def config(reward: str, *overrides: str):
    return load_config(None, [f"rollout.group_size={GROUP}", "learner.batch_size=4", "buffer.capacity_groups=64", "reward.num_workers=1",
                              f"task.reward={reward}", *overrides])


def records(n: int, responses: list[str], prompt: Prompt) -> list[dict]:
    gid = GroupId("t", 0, n)
    return [new_sample(run_id="t", sample_id=gid.sample_id(i), group_id=str(gid), worker_id=0, prompt_id=prompt.prompt_id,
                       prompt_text=prompt.text, prompt_ids=[1], response_ids=[2], response_text=r, behavior_logprobs=[-1.0],
                       policy_version_start=0, policy_version_end=0) for i, r in enumerate(responses)]


@pytest.fixture
def pool(ray_local, tmp_path):
    """(make(reward, *overrides) -> (reward actor, buffer), store dir); everything made is killed after the test."""
    made = []

    def make(reward: str, *overrides: str):
        cfg = config(reward, *overrides)
        buffer = ray.remote(ReplayBuffer).remote(cfg, str(tmp_path / "traj"))
        ray.get(buffer.admit.remote(64, 0))
        actor = ray.remote(RewardWorker).options(max_concurrency=1000).remote(0, cfg, buffer)
        made.extend([actor, buffer])
        return actor, buffer

    yield make, tmp_path / "traj"
    for actor in made:
        ray.kill(actor)


def stored(buffer, store_dir) -> list[dict]:
    ray.get(buffer.close.remote())
    return read_trajectories(store_dir).to_pylist()


P = Prompt("1+1", "1+1=", "2")


def test_scored_groups_reach_the_buffer_with_their_rewards(pool):
    make, store_dir = pool
    actor, buffer = make("exact_match")
    answers = ray.get([actor.score.remote(records(k, ["2", "3", " 2 ", "22"], P), P) for k in range(3)])
    assert all(a.failures == () and a.size == GROUP and not a.duplicate for a in answers)
    batch = ray.get(buffer.get_batch.remote(3, 0, 0, 5.0))
    assert [r["reward"] for r in batch] == [1.0, 0.0, 1.0, 0.0] * 3
    assert all(r["t_scored"] is not None for r in batch)
    stats = ray.get(actor.stats.remote())
    assert stats.groups == 3 and stats.samples == 12 and len(stats.latencies) == 12 and stats.queue_depth == 0
    assert ray.get(actor.stats.remote()).latencies == ()  # drained by the call before


def test_the_cache_scores_each_distinct_response_once(pool):
    make, _ = pool
    actor, _ = make("exact_match")
    ray.get(actor.score.remote(records(0, ["2", "3", "2", "3"], P), P))  # repeats inside a group
    ray.get(actor.score.remote(records(1, ["2", "3", "2", "3"], P), P))  # and across groups of the prompt
    s = ray.get(actor.stats.remote())
    assert s.scored == 2 and s.samples == 8 and (s.cache_hits, s.cache_misses) == (6, 2)
    other = Prompt("other id", "1+1=", "4")  # another answer: another key
    ray.get(actor.score.remote(records(2, ["2", "2", "2", "2"], other), other))
    assert ray.get(actor.stats.remote()).scored == 3


def test_the_cache_is_off_for_a_reward_marked_non_deterministic_and_by_config(pool):
    make, _ = pool
    for actor, _ in (make("tests.reward_fns.noisy"), make("exact_match", "reward.cache=false")):
        ray.get(actor.score.remote(records(0, ["2", "2", "2", "2"], P), P))
        ray.get(actor.score.remote(records(1, ["2", "2", "2", "2"], P), P))
        s = ray.get(actor.stats.remote())
        assert s.scored == 8 and s.cache_hits == 0


def test_a_batched_reward_gets_batches_larger_than_one(pool):
    make, store_dir = pool
    actor, buffer = make("tests.reward_fns.batch_sizes", "reward.batch_size=6", "reward.batch_wait_s=0.5", "reward.cache=false")
    ray.get([actor.score.remote(records(k, ["a", "b", "c", "d"], P), P) for k in range(3)])  # 12 samples at once
    rows = stored(buffer, store_dir)
    assert sorted({r["reward"] for r in rows}) == [6.0]  # two calls of 6
    s = ray.get(actor.stats.remote())
    assert s.calls == 2 and s.batches == 2 and s.batched_samples == 12


def test_a_group_handed_over_twice_is_scored_and_delivered_once(pool):
    make, store_dir = pool
    actor, buffer = make("exact_match", "reward.cache=false")
    group = records(0, ["2", "3", "4", "5"], P)
    first, second = ray.get([actor.score.remote(group, P), actor.score.remote(group, P)])
    assert sorted([first.duplicate, second.duplicate]) == [False, True]
    rows = stored(buffer, store_dir)
    assert len(rows) == GROUP and len({r["sample_id"] for r in rows}) == GROUP
    assert ray.get(actor.stats.remote()).scored == GROUP


def test_a_hung_reward_is_killed_at_the_timeout_and_its_group_recorded_with_the_reason(pool):
    make, store_dir = pool
    actor, buffer = make("tests.reward_fns.hang_on_x", "task.reward_timeout_s=1.0")
    ok = ray.get(actor.score.remote(records(0, ["a", "bb", "c", "d"], P), P))
    pid = ray.get(actor.child_pid.remote())
    t0 = time.monotonic()
    hung = ray.get(actor.score.remote(records(1, ["a", "x", "c", "d"], P), P))
    assert time.monotonic() - t0 < 30
    assert ok.failures == () and hung.failures == ("reward timed out after 1 s (its process was killed)",)
    assert not alive(pid) and ray.get(actor.child_pid.remote()) is None  # the next call starts a fresh one
    after = ray.get(actor.score.remote(records(2, ["a", "b", "c", "d"], P), P))
    assert after.failures == () and ray.get(actor.child_pid.remote()) not in (None, pid)
    rows = {r["sample_id"]: r for r in stored(buffer, store_dir)}
    group = [rows[GroupId("t", 0, 1).sample_id(i)] for i in range(GROUP)]
    assert [r["status"] for r in group] == ["dropped_error"] * GROUP
    assert [r["status_reason"] for r in group] == ["a sample of its group failed", "reward timed out after 1 s (its process was killed)",
                                                   "a sample of its group failed", "a sample of its group failed"]
    assert len(rows) == 3 * GROUP and ray.get(actor.stats.remote()).timeouts == 1


def test_a_reward_that_kills_its_process_drops_its_group_and_the_pool_goes_on(pool):
    make, store_dir = pool
    actor, buffer = make("tests.reward_fns.die_on_x")
    died = ray.get(actor.score.remote(records(0, ["a", "b", "x", "d"], P), P))
    fine = ray.get(actor.score.remote(records(1, ["a", "b", "c", "d"], P), P))
    assert died.failures == ("reward process died (exit code 7)",) and fine.failures == ()
    assert ray.get(actor.stats.remote()).crashes == 1
    statuses = sorted((r["group_id"][-2:], r["status"]) for r in stored(buffer, store_dir))
    assert statuses == [("g0", "dropped_error")] * GROUP + [("g1", "unconsumed_at_end")] * GROUP


def test_close_leaves_no_scoring_process(pool):
    make, _ = pool
    actor, _ = make("exact_match")
    ray.get(actor.score.remote(records(0, ["2"] * GROUP, P), P))
    pid = ray.get(actor.child_pid.remote())
    assert pid is not None and alive(pid)
    ray.get(actor.close.remote())
    assert not alive(pid)


def test_killing_the_reward_actor_takes_its_child_with_it(pool):
    make, _ = pool
    actor, _ = make("exact_match")
    ray.get(actor.score.remote(records(0, ["2"] * GROUP, P), P))
    pid = ray.get(actor.child_pid.remote())
    ray.kill(actor)  # SIGKILL: no close(); the kernel ends the child (PR_SET_PDEATHSIG)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_eval_scores_come_from_the_pool_and_a_failure_is_an_error(pool):
    make, _ = pool
    actor, _ = make("tests.reward_fns.raise_on_x")
    assert ray.get(actor.score_texts.remote([P, P], ["a", "bb"])) == [1.0, 2.0]
    with pytest.raises(ray.exceptions.RayTaskError, match="could not score eval prompt '1\\+1': reward raised ValueError"):
        ray.get(actor.score_texts.remote([P], ["x"]))


# ---- slow: the whole pipeline with a pool ---------------------------------------------------------

def scoring_children(tag: Path | str | None = None) -> list[int]:
    """Pids of live multiprocessing children (asyncrl starts only the reward pool's scoring processes and an
    environment's tool processes); with `tag`, only those of the run started with tagged(tag) (their environment
    holds its tag), so that another run on the machine does not count."""
    found = []
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            with open(f"/proc/{proc}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode()
            if tag is not None:
                with open(f"/proc/{proc}/environ", "rb") as f:
                    if f"{RUN_TAG}={tag}".encode() not in f.read().split(b"\0"):
                        continue
        except OSError:
            continue
        if "multiprocessing.spawn" in cmd and "spawn_main" in cmd and alive(int(proc)):
            found.append(int(proc))
    return found


@pytest.mark.slow
def test_a_run_with_hung_and_crashing_rewards_finishes_with_every_sample_recorded_once(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={out}", f"model.path={tiny_model_dir}",
           "run.steps=8", "run.eval=false", "reward.num_workers=2", "reward.num_cpus=0.5", "task.reward=tests.reward_fns.faulty_exact_match",
           "task.reward_timeout_s=1.0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=tagged(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_trajectories(out / "trajectories").to_pylist()
    ids = [r["sample_id"] for r in rows]
    assert len(ids) == len(set(ids)) and all(r["status"] for r in rows)
    summary = json.loads(Path(out / "summary.json").read_text())
    assert summary["samples"]["consumed"] == sum(r["status"] == "consumed" for r in rows) == 8 * 16
    by_total = {}
    for r in rows:
        if r["status"] in ("consumed", "dropped_error", "unconsumed_at_end", "dropped_stale"):
            by_total.setdefault(int(r["prompt_id"].split("+")[0]) + int(r["prompt_id"].split("+")[1]), set()).add(
                (r["status"], r["status_reason"] if r["status"] == "dropped_error" else None))
    hung = [t for t in by_total if t % 7 == 0]
    crashed = [t for t in by_total if t % 11 == 0 and t % 7]
    assert hung and crashed, sorted(by_total)  # the prompt stream met both faults
    reasons = {reason for t in hung for _, reason in by_total[t]}
    assert "reward timed out after 1 s (its process was killed)" in reasons and all(s == "dropped_error" for t in hung for s, _ in by_total[t])
    assert any("reward process died (exit code 3)" == reason for t in crashed for _, reason in by_total[t])
    assert all(s != "dropped_error" for t, v in by_total.items() if t % 7 and t % 11 for s, _ in v)  # the others scored
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    assert last["reward/timeouts_total"] >= 1 and last["reward/crashes_total"] >= 1 and "reward/latency_p99_s" in last
    documented = set(re.findall(r"`([a-z_]+/[a-z0-9_<>/]+)`", (ROOT / "docs/metrics.md").read_text()))
    logged = {re.sub(r"/w\d+/", "/w<i>/", k) for row in metrics for k in row if "/" in k}
    assert not logged - documented, f"add these to docs/metrics.md: {sorted(logged - documented)}"
    deadline = time.monotonic() + 20
    while (actor_processes(out) or scoring_children(out)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert actor_processes(out) == [] and scoring_children(out) == []  # nothing left running


def worker_with_a_pool(model_dir: str, tmp_path: Path, *overrides: str) -> tuple:
    """(buffer, reward pool, rollout worker started in this process) scoring a slow batched reward, 24 groups at most."""
    from asyncrl.actors.rollout import RolloutWorker
    from asyncrl.orchestration.pools import RewardPool

    cfg = load_config(None, [f"rollout.group_size={GROUP}", "rollout.max_new_tokens=8", "rollout.max_inflight_groups=2", "learner.batch_size=8",
                             "buffer.capacity_groups=24", "buffer.max_staleness=100", "reward.num_cpus=0",
                             "task.reward=tests.reward_fns.sleepy_batched", "reward.batch_size=2", "reward.batch_wait_s=0", *overrides])
    buffer = ray.remote(ReplayBuffer).remote(cfg, str(tmp_path / "traj"))
    pool = RewardPool(cfg, None, buffer)
    worker = RolloutWorker(0, cfg, model_dir, buffer, "t", scorers=pool.actors)
    worker.start()
    return buffer, pool, worker


@pytest.mark.slow
def test_groups_held_by_a_reward_actor_that_dies_are_handed_over_again_and_scored_once(random_model_dir, ray_local, tmp_path):
    buffer, pool, worker = worker_with_a_pool(random_model_dir, tmp_path, "reward.num_workers=1")
    deadline = time.monotonic() + 120
    while ray.get(buffer.stats.remote())["buffered_groups"] < 1 and time.monotonic() < deadline:  # the actor scores
        time.sleep(0.01)
    while len(worker.scoring.client.scoring) < 3 and time.monotonic() < deadline:  # groups queue up: 100 ms per call of 2 samples
        time.sleep(0.01)
    held = {hand.records[0]["group_id"] for hand in list(worker.scoring.client.scoring.values())}
    assert len(held) >= 3
    ray.kill(pool.actors[0], no_restart=False)  # its process dies with the groups it held; Ray starts it again
    deadline = time.monotonic() + 180
    while ray.get(buffer.stats.remote())["buffered_groups"] < 24 and time.monotonic() < deadline:  # capacity: then admission stops
        time.sleep(0.1)
    end = worker.stop()
    pool.close()
    rows = stored(buffer, tmp_path / "traj")
    assert len(rows) == len({r["sample_id"] for r in rows}) == worker.flight.next_group * GROUP  # every sample once
    statuses = Counter((r["status"], r["status_reason"]) for r in rows)
    assert end.scoring_retries >= 1 and end.reward_errors == 0 and end.error is None, (end, statuses)
    scored = {r["group_id"] for r in rows if r["status"] == "unconsumed_at_end" and r["reward"] is not None}
    assert held <= scored and len(scored) == 24, statuses  # what the dead actor held was scored by its successor, once
    assert set(statuses) <= {("unconsumed_at_end", "run stopped before it was trained on"),
                             ("aborted_at_end", "run stopped while its group was generating")}, statuses


def _freeze(actor) -> None:
    """In a reward actor's process: stop it (SIGSTOP), as a process stuck outside its scoring child would be."""
    import os
    import signal
    import threading

    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGSTOP)).start()  # after this call has answered


@pytest.mark.slow
def test_a_frozen_reward_actor_is_found_by_the_watchdog_restarted_and_its_groups_scored_once(random_model_dir, ray_local, tmp_path):
    buffer, pool, worker = worker_with_a_pool(random_model_dir, tmp_path, "reward.num_workers=2", "run.hang_first_s=60",
                                              "run.hang_floor_s=3", "run.hang_factor=3")
    deadline = time.monotonic() + 120
    while ray.get(buffer.stats.remote())["buffered_groups"] < 6 and time.monotonic() < deadline:  # hand-overs timed
        time.sleep(0.01)
    ray.get(pool.actors[0].__ray_call__.remote(_freeze))
    deadline = time.monotonic() + 240
    while ray.get(buffer.stats.remote())["buffered_groups"] < 24 and time.monotonic() < deadline:  # capacity: then admission stops
        time.sleep(0.1)
    end = worker.stop()
    back, deadline = None, time.monotonic() + 120
    while time.monotonic() < deadline:  # restarted by Ray: it answers again
        try:
            back = ray.get(pool.actors[0].node_id.remote(), timeout=10)
            break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            time.sleep(1)
    pool.close()
    rows = stored(buffer, tmp_path / "traj")
    assert len(rows) == len({r["sample_id"] for r in rows}) == worker.flight.next_group * GROUP  # every sample once
    statuses = Counter((r["status"], r["status_reason"]) for r in rows)
    assert back and end.reward_hangs == 1 and end.scoring_retries >= 1 and end.error is None, (end, statuses)
    assert len({r["group_id"] for r in rows if r["status"] == "unconsumed_at_end" and r["reward"] is not None}) == 24, statuses
