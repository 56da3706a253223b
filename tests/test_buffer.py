"""ReplayBuffer in-process: staleness drops, admission, exactly-one status per sample."""
import asyncio
import time

from asyncrl.actors.buffer import ReplayBuffer
from asyncrl.core.config import load_config
from asyncrl.core.schema import new_sample
from asyncrl.core.store import read_trajectories


def group(gid, version, size=2, status=None):
    return [new_sample(sample_id=f"{gid}-{i}", group_id=gid, policy_version_start=version, reward=float(i),
                       prompt_ids=[1], response_ids=[2], behavior_logprobs=[-1.0], status=status) for i in range(size)]


def make(tmp_path, *overrides):
    cfg = load_config(None, ["rollout.group_size=2", "learner.batch_size=4", "buffer.capacity_groups=6", *overrides])
    return ReplayBuffer(cfg, str(tmp_path / "traj"))


def run(coro):
    return asyncio.run(coro)


def test_admission_follows_staleness_rule(tmp_path):
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=1")  # 2 groups/step, sync_every 1
        assert await buf.admit(10) == 4  # (0 + 1 + 1) * 2
        assert await buf.admit(1) == 0
        await buf.set_version(1)
        assert await buf.admit(10) == 2  # capacity 6 groups total live at v1
        return buf.counts
    counts = run(scenario())
    assert counts["admitted_groups"] == 6 and counts["refused_admissions"] == 3  # three calls got less than asked


def test_never_hands_out_stale_and_records_every_sample(tmp_path):
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=1")
        await buf.admit(4)
        for gid, v in [("a", 0), ("b", 2), ("c", 1), ("d", 2)]:
            await buf.put(group(gid, v))
        batch = await buf.get_batch(2, version=2, step=0, timeout_s=1.0)  # a is 2 behind: dropped
        assert [s["group_id"] for s in batch] == ["c", "c", "b", "b"]  # oldest first: c (v1) before b (v2)
        assert all(s["status"] == "consumed" and s["consumed_version"] == 2 for s in batch)
        assert await buf.get_batch(2, version=2, step=1, timeout_s=0.05) is None  # only d left: times out
        await buf.put(group("e", 0, status="dropped_error"))
        return await buf.close()
    counts = run(scenario())
    assert counts["dropped_stale"] == 2 and counts["consumed"] == 4 and counts["unconsumed"] == 2
    table = read_trajectories(tmp_path / "traj").to_pylist()
    statuses = {r["sample_id"]: r["status"] for r in table}
    assert len(statuses) == len(table) == 10  # every sample once
    assert statuses["a-0"] == "dropped_stale" and statuses["d-1"] == "unconsumed_at_end" and statuses["e-0"] == "dropped_error"


def test_get_batch_waits_for_a_put(tmp_path):
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=0")
        await buf.admit(2)
        waiter = asyncio.create_task(buf.get_batch(2, version=0, step=0, timeout_s=5.0))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await buf.put(group("x", 0))
        await buf.put(group("y", 0))
        return await waiter
    assert len(run(scenario())) == 4


def test_dropped_groups_free_admission(tmp_path):
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=0")
        assert await buf.admit(5) == 2
        await buf.put(group("bad", 0, status="dropped_error"))
        return await buf.admit(5)
    assert run(scenario()) == 1


def test_group_ids_are_built_and_parsed_in_one_place():
    from asyncrl.core.messages import GroupId, group_of

    gid = GroupId("smoke-1a2b3c", 3, 17)
    assert str(gid) == "smoke-1a2b3c-w3-g17" and GroupId.parse(str(gid)) == gid
    assert GroupId.parse("run-with-w2-g5-in-it-w1-g4") == GroupId("run-with-w2-g5-in-it", 1, 4)  # the last -w/-g parts
    assert group_of(gid.sample_id(7)) == str(gid)
    assert GroupId.parse("made-by-hand") is None and GroupId.parse("x-w1-gA") is None


def test_zero_variance_groups_are_filtered_and_free_their_admission(tmp_path):
    def equal(gid, reward):
        return [{**s, "reward": reward} for s in group(gid, 0)]

    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=0", "algorithm.filter_zero_variance=true")
        assert await buf.admit(10) == 2  # (0 + 0 + 1) * 2 groups
        await buf.put(equal("a", 1.0))  # all right: filtered, its admission is free again
        assert await buf.admit(10) == 1
        await buf.put(group("b", 0))  # rewards 0, 1: kept
        await buf.put(equal("c", 0.0))  # all wrong: filtered
        assert (await buf.stats())["buffered_groups"] == 1 and await buf.admit(10) == 1
        await buf.put(group("d", 0))
        batch = await buf.get_batch(2, version=0, step=0, timeout_s=1.0)
        assert [s["group_id"] for s in batch] == ["b", "b", "d", "d"]
        return await buf.close()
    counts = run(scenario())
    assert counts["filtered"] == 4 and counts["consumed"] == 4
    rows = read_trajectories(tmp_path / "traj").to_pylist()
    assert len(rows) == len({r["sample_id"] for r in rows}) == 8
    filtered = {r["group_id"] for r in rows if r["status"] == "filtered"}
    assert filtered == {"a", "c"} and all(r["status_reason"].startswith("all 2 rewards equal") for r in rows if r["group_id"] in filtered)


def test_filtering_sees_the_overlong_penalty(tmp_path):
    async def scenario():
        # max_new_tokens 8, buffer 4: a 1-token response is not penalised, an 8-token one loses 1.0
        buf = make(tmp_path, "algorithm.filter_zero_variance=true", "algorithm.overlong_penalty=1.0", "algorithm.overlong_buffer=4")
        await buf.admit(2)
        long_right = [{**s, "reward": 1.0, "response_ids": [2] * (1 if i == 0 else 8)} for i, s in enumerate(group("a", 0))]
        await buf.put(long_right)  # task rewards 1, 1 but shaped 1, 0: kept
        await buf.put([{**s, "reward": float(i), "response_ids": [2] * (1 if i == 0 else 8)} for i, s in enumerate(group("b", 0))])
        return await buf.stats()  # b: task rewards 0, 1 but shaped 0, 0: filtered
    stats = run(scenario())
    assert stats["filtered"] == 2 and stats["buffered_groups"] == 1


def test_batches_take_the_oldest_groups_first_or_in_arrival_order(tmp_path):
    async def scenario(oldest_first: bool) -> list[str]:
        buf = make(tmp_path / str(oldest_first), "buffer.max_staleness=2", f"buffer.oldest_first={str(oldest_first).lower()}")
        await buf.admit(4)
        for gid, v in [("new", 2), ("old", 0), ("mid", 1), ("new2", 2)]:  # "old" arrives second: a long group, late
            await buf.put(group(gid, v))
        first = await buf.get_batch(2, version=2, step=0, timeout_s=1.0)
        second = await buf.get_batch(2, version=2, step=1, timeout_s=1.0)
        return [s["group_id"] for s in first + second][::2]
    assert run(scenario(True)) == ["old", "mid", "new", "new2"]
    assert run(scenario(False)) == ["new", "old", "mid", "new2"]


async def held(buf, requested: int, worker: int):
    """An admission call that the buffer holds (it cannot grant it yet): still waiting after 50 ms."""
    waiting = asyncio.create_task(buf.admit(requested, worker, worker_version=0, wait_s=5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    return waiting


def test_a_worker_behind_the_bound_waits_for_its_new_weights(tmp_path):
    """max_staleness=0: a worker still holding version 0 once version 1 is published is not admitted (what it started
    would be stale when trained on) until it says it loaded version 1; the call waits for that instead of refusing."""
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=0")  # 2 groups per version
        assert await buf.admit(2, 0, worker_version=0) == 2
        await buf.put(group("a", 0))
        await buf.put(group("b", 0))
        assert len(await buf.get_batch(2, version=0, step=0, timeout_s=1.0)) == 4
        await buf.set_version(1)
        assert await buf.admit(2, 0, worker_version=0, wait_s=0.05) == 0  # behind: times out with nothing
        waiting = await held(buf, 2, 0)
        await buf.loaded(0, 1)
        return await asyncio.wait_for(waiting, 1.0), buf.counts
    admitted, counts = run(scenario())
    assert admitted == 2 and counts["refused_admissions"] == 1


def test_an_admission_waits_for_room_and_is_answered_when_it_comes(tmp_path):
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=0")
        assert await buf.admit(5, 0, worker_version=0) == 2
        waiting = await held(buf, 5, 0)  # full: held, not refused
        await buf.put(group("bad", 0, status="dropped_error"))  # frees one admission
        first = await asyncio.wait_for(waiting, 1.0)
        t0 = asyncio.get_running_loop().time()
        none = await buf.admit(5, 0, worker_version=0, wait_s=0.1)  # nothing changes: answered 0 at the deadline
        return first, none, asyncio.get_running_loop().time() - t0, buf.counts
    first, none, waited, counts = run(scenario())
    assert first == 1 and none == 0 and waited >= 0.09
    assert counts["refused_admissions"] == 3 and counts["admitted_groups"] == 3  # each call got less than it asked


def test_a_dead_workers_waiting_admission_admits_nothing(tmp_path):
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=0")
        assert await buf.admit(2, 3, worker_version=0) == 2
        waiting = await held(buf, 2, 3)
        assert await buf.forfeit(3, "r", 2, "worker died") == 2  # frees both admissions: the waiting call must not take them
        late = await asyncio.wait_for(waiting, 1.0)
        return late, buf.live, await buf.admit(2, 3, worker_version=0)  # the replacement is admitted
    late, live, replacement = run(scenario())
    assert late == 0 and live == 0 and replacement == 2


def test_a_stopped_workers_waiting_admission_answers_at_once(tmp_path):
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=0")
        assert await buf.admit(2, 1, worker_version=0) == 2
        waiting = await held(buf, 2, 1)
        t0 = asyncio.get_running_loop().time()
        await buf.release(1)
        return await asyncio.wait_for(waiting, 1.0), asyncio.get_running_loop().time() - t0, buf.live
    answer, waited, live = run(scenario())
    assert answer == 0 and waited < 1.0 and live == 2  # nothing admitted; the wait (5 s) did not run out


def rollout_group(worker: int, number: int, version: int, size: int = 2) -> list[dict]:
    """A group as a rollout worker names it (its `number`-th admitted group), started at `version`."""
    from asyncrl.core.messages import GroupId
    gid = GroupId("r", worker, number)
    return [new_sample(sample_id=gid.sample_id(i), group_id=str(gid), worker_id=worker, policy_version_start=version,
                       reward=float(i), prompt_ids=[1], response_ids=[2], behavior_logprobs=[-1.0]) for i in range(size)]


def test_the_last_batch_at_a_version_waits_for_a_long_group_instead_of_dropping_it(tmp_path):
    """Bound 1: a group admitted at version 0 can be trained on at version 1 and not after. At version 1, with two
    newer groups ready, the batch waits for it (up to buffer.expiring_wait_s) and takes it first when it comes; with
    the wait off, the batch takes the newer groups and the long group is dropped as stale at version 2."""
    async def scenario(wait_s: float) -> tuple[list[str], dict]:
        buf = make(tmp_path / str(wait_s), "buffer.max_staleness=1", f"buffer.expiring_wait_s={wait_s}")
        assert await buf.admit(1, 0, worker_version=0) == 1  # group 0: the long one
        await buf.set_version(1)
        await buf.loaded(0, 1)
        assert await buf.admit(2, 0, worker_version=1) == 2
        await buf.put(rollout_group(0, 1, 1))
        await buf.put(rollout_group(0, 2, 1))
        batch = asyncio.create_task(buf.get_batch(1, version=1, step=0, timeout_s=2.0))
        await asyncio.sleep(0.2)
        waited = not batch.done()
        await buf.put(rollout_group(0, 0, 0))
        first = await batch
        second = await buf.get_batch(1, version=2, step=1, timeout_s=0.2)
        return [first[0]["group_id"], second[0]["group_id"], str(waited)], await buf.close()
    order, counts = run(scenario(10.0))
    assert order == ["r-w0-g0", "r-w0-g1", "True"] and counts["dropped_stale"] == 0 and counts["unconsumed"] == 2
    order, counts = run(scenario(0.0))
    assert order == ["r-w0-g1", "r-w0-g2", "False"] and counts["dropped_stale"] == 2


def test_a_batch_waits_for_an_expiring_group_only_so_long_and_not_for_a_dead_workers(tmp_path):
    async def scenario():
        buf = make(tmp_path, "buffer.max_staleness=1", "buffer.expiring_wait_s=0.3")
        assert await buf.admit(1, 0, worker_version=0) == 1  # group 0: it never comes
        await buf.set_version(1)
        await buf.loaded(0, 1)
        assert await buf.admit(2, 0, worker_version=1) == 2
        await buf.put(rollout_group(0, 1, 1))
        t0 = time.monotonic()
        batch = await buf.get_batch(1, version=1, step=0, timeout_s=5.0)  # waits 0.3 s for group 0, then goes on
        waited = time.monotonic() - t0
        assert await buf.forfeit(0, "r", 2, "worker died") == 3  # groups 0 and 2 lost: recorded, none left in flight
        await buf.put(rollout_group(1, 0, 1))
        t0 = time.monotonic()
        assert (await buf.get_batch(1, version=1, step=1, timeout_s=5.0))[0]["group_id"] == "r-w1-g0"
        return batch, waited, time.monotonic() - t0, await buf.stats()
    batch, waited, second, stats = run(scenario())
    assert batch[0]["group_id"] == "r-w0-g1" and 0.3 <= waited < 2.0 and second < 0.2
    assert stats["expiring_wait_batches"] == 1 and 0.3 <= stats["expiring_wait_s"] < 2.0 and stats["lost"] == 4


def test_a_restored_buffer_goes_on_from_its_checkpoints_counts_and_expiring_wait_totals(tmp_path):
    """A resumed run's buffer continues the counters its checkpoint kept, the expiring-group waits' totals among
    them (not mixed into the sample counts), and a checkpoint written before those totals were kept resumes them
    at zero."""
    async def scenario(counts):
        buf = make(tmp_path / str(len(counts)))
        await buf.restore(3, 4, counts)
        return await buf.stats(), buf.counts
    counts = {"admitted_groups": 5, "consumed": 8, "dropped_stale": 2, "expiring_wait_batches": 3, "expiring_wait_s": 4.5}
    stats, kept = run(scenario(counts))
    assert (stats["expiring_wait_batches"], stats["expiring_wait_s"], stats["dropped_stale"], stats["version"]) == (3, 4.5, 2, 3)
    assert "expiring_wait_s" not in kept and kept["consumed"] == 8
    old_stats, _ = run(scenario({"consumed": 8}))
    assert (old_stats["expiring_wait_batches"], old_stats["expiring_wait_s"], old_stats["consumed"]) == (0, 0.0, 8)
