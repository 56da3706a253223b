"""RewardWorker: the reward station, between the rollout workers and the buffer.

An asyncio Ray actor. A rollout worker hands it a finished group (`score`) and goes on generating; the call
returns once the group, scored, has reached the buffer. Samples from every group waiting here are gathered into
batches (up to `reward.batch_size`, waiting at most `reward.batch_wait_s` for more), looked up in the cache
(deterministic rewards only), and the rest are scored in a child process (asyncrl.core.scoring.ScoringProcess)
that is killed, with everything it started, when a call runs past `task.reward_timeout_s` or dies; its samples
get the reason and a fresh child takes the next call. A group with a sample that has no reward is delivered as
dropped_error (GRPO needs whole groups), as in the rollout worker's own loop.

Groups waiting here were admitted by the buffer and are not yet delivered, so they count against the staleness
bound's admission like groups still generating; the buffer still judges each group's staleness when it is
trained. Every request carries its sample ids: a group handed over twice is scored and delivered once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import ray

from asyncrl.core.config import Config
from asyncrl.core.deadlines import StageClock, hung_message
from asyncrl.core.messages import GroupScored, RewardStats
from asyncrl.core.schema import Status
from asyncrl.core.scoring import RewardCache, Scored, ScoringProcess, cache_key
from asyncrl.core.prompts import Prompt
from asyncrl.core.util import pin_to_cores

SCORING_TRIES = 6
"""Hand-overs of one group to the reward pool (the first and retries 2, 4, 8, 16 s apart, to the next actor each
time) before it is recorded as dropped_error: enough for Ray to restart a reward actor that died."""

LATENCY_LIMIT = 100_000
"""Latencies kept between two stats calls (a stalled controller must not grow the actor without bound)."""


@dataclass
class _HandOff:
    """A finished group given to the reward pool: its records, its prompt, its actor and the tries so far."""
    records: list[dict]
    prompt: Prompt
    route: int
    tries: int = 0
    sent: float = 0.0  # when it was last sent (monotonic)


@dataclass
class _Item:
    prompt: Prompt
    response: str
    t_queued: float
    done: asyncio.Future = field(repr=False, default=None)


def reward_options(cfg: Config) -> dict:
    """What a built-in reward is made from in the child process (reward_model: its directory and device)."""
    return {"model_path": cfg.reward.model_path, "device": "cuda" if cfg.reward.num_gpus > 0 else "cpu"}


class RewardWorker:
    def __init__(self, worker_id: int, cfg: Config, buffer) -> None:
        pin_to_cores(cfg.reward.cpu_affinity)  # the scoring child inherits it
        self.id, self.cfg, self.buffer = worker_id, cfg, buffer
        self.proc = ScoringProcess(cfg.task.reward, reward_options(cfg), cfg.task.reward_timeout_s)
        traits = self.proc.traits
        self.cacheable, self.version = cfg.reward.cache and traits.deterministic, traits.version
        self.cache = RewardCache(cfg.reward.cache_size)
        self.queue: asyncio.Queue[_Item] | None = None  # made on the actor's event loop, at the first call
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"reward-{worker_id}")  # one call at a time into the child
        self.seen: set[str] = set()  # sample ids handed over (a second hand-over is ignored)
        self.stats_ = RewardStats(worker_id=worker_id)
        self.latencies: list[float] = []
        self.in_batch = 0
        self.t0 = time.monotonic()
        self.batcher: asyncio.Task | None = None

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    async def score(self, group: list[dict], prompt: Prompt) -> GroupScored:
        """Score the group's samples, deliver it to the buffer, and say which samples failed."""
        ids = [r["sample_id"] for r in group]
        if any(i in self.seen for i in ids):
            self.stats_.duplicates += 1
            return GroupScored(size=len(group), duplicate=True)
        self.seen.update(ids)
        t0 = time.monotonic()
        results = await self._answer(prompt, [r["response_text"] for r in group])
        failures = _apply(group, results)
        await self.buffer.put.remote(group)
        self.stats_.groups += 1
        self.stats_.group_wait_s += time.monotonic() - t0
        return GroupScored(failures=tuple(failures), size=len(group))

    async def score_texts(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        """Rewards of pairs outside training (evaluation); a pair that cannot be scored is an error."""
        results = await asyncio.gather(*[self._answer(p, [r]) for p, r in zip(prompts, responses)])
        for (res,), p in zip(results, prompts):
            if res.value is None:
                raise RuntimeError(f"reward {self.cfg.task.reward!r} could not score eval prompt {p.prompt_id!r}: {res.error}")
        return [res.value for (res,) in results]

    async def _answer(self, prompt: Prompt, responses: list[str]) -> list[Scored]:
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.batcher = asyncio.get_running_loop().create_task(self._batches())
        loop = asyncio.get_running_loop()
        items = [_Item(prompt, r, time.monotonic(), loop.create_future()) for r in responses]
        for item in items:
            self.queue.put_nowait(item)
        return list(await asyncio.gather(*[item.done for item in items]))

    async def _batches(self) -> None:
        """Forever: take a batch from the queue, answer it from the cache and the child process."""
        cfg = self.cfg.reward
        while True:
            batch = [await self.queue.get()]
            deadline = time.monotonic() + cfg.batch_wait_s
            while len(batch) < cfg.batch_size:
                try:
                    batch.append(self.queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), left))
                except asyncio.TimeoutError:
                    break
            self.in_batch = len(batch)
            try:
                await self._run_batch(batch)
            except Exception as exc:  # never leave a caller waiting
                for item in batch:
                    if not item.done.done():
                        item.done.set_result(Scored(error=f"reward worker failed: {exc!r}"))
            self.in_batch = 0

    async def _run_batch(self, batch: list[_Item]) -> None:
        s = self.stats_
        s.batches += 1
        s.batched_samples += len(batch)
        if not self.cacheable:  # every sample is scored: repeats are not shared
            s.cache_misses += len(batch)
            await self._call({str(i): [item] for i, item in enumerate(batch)})
            return
        todo: dict[str, list[_Item]] = {}  # key -> the items that share it (repeats in one batch are scored once)
        for item in batch:
            key = cache_key(self.cfg.task.reward, self.version, item.prompt, item.response)
            value = None if key in todo else self.cache.get(key)
            if value is not None:
                self._finish(item, Scored(value=value))
                s.cache_hits += 1
            elif key in todo:
                todo[key].append(item)
                s.cache_hits += 1
            else:
                todo[key] = [item]
                s.cache_misses += 1
        if todo:
            await self._call(todo)

    async def _call(self, todo: dict[str, list[_Item]]) -> None:
        firsts = [items[0] for items in todo.values()]
        before = (self.proc.timeouts, self.proc.crashes)
        t0 = time.monotonic()
        results = await asyncio.get_running_loop().run_in_executor(
            self.executor, self.proc.score, [i.prompt for i in firsts], [i.response for i in firsts])
        s = self.stats_
        s.busy_s += time.monotonic() - t0
        s.scored += len(firsts)
        s.calls += 1 if self.proc.traits.batched else len(firsts)
        s.timeouts += self.proc.timeouts - before[0]
        s.crashes += self.proc.crashes - before[1]
        for key, res in zip(todo, results):
            if res.value is not None and self.cacheable:
                self.cache.put(key, res.value)
            s.errors += int(res.error is not None and res.error.startswith("reward raised"))
            for item in todo[key]:
                self._finish(item, res)

    def _finish(self, item: _Item, res: Scored) -> None:
        self.stats_.samples += 1
        if len(self.latencies) < LATENCY_LIMIT:
            self.latencies.append(time.monotonic() - item.t_queued)
        item.done.set_result(res)

    async def stats(self) -> RewardStats:
        """Running totals, and the latencies since the last call (drained)."""
        latencies, self.latencies = self.latencies, []
        depth = (self.queue.qsize() if self.queue is not None else 0) + self.in_batch
        return dataclasses.replace(self.stats_, wall_s=time.monotonic() - self.t0, queue_depth=depth, latencies=tuple(latencies))

    async def child_pid(self) -> int | None:
        """The scoring child's process id (None when none runs): for tests that check nothing is left."""
        return self.proc.pid

    async def close(self) -> None:
        """Kill the scoring child (and what it started)."""
        self.proc.close()


def _apply(group: list[dict], results: list[Scored]) -> list[str]:
    """Write each sample's reward, or drop the whole group as dropped_error when a sample has none; the reasons."""
    now = time.time()
    failures = [res.error for res in results if res.value is None]
    for record, res in zip(group, results):
        record["reward"] = res.value
        record["t_scored"] = now
    if failures:
        for record, res in zip(group, results):
            record.update(status=Status.DROPPED_ERROR.value, status_reason=res.error or "a sample of its group failed")
    return failures


class RewardClient:
    """A rollout worker's side of the pool: hand finished groups over, take the answers, and hand a group over
    again when its reward actor died or was restarting. Delivery is idempotent (the buffer ignores a group it
    has), so a group the dead actor had delivered is not trained twice; after SCORING_TRIES the group is recorded
    as dropped_error. `put` and `count_failures` are the rollout worker's (its buffer hand-off and its
    consecutive-failure rule); `counters` are its WorkerCounters."""

    def __init__(self, scorers: list, counters, put: Callable[[list[dict]], None], count_failures: Callable[[bool, str], None],
                 clock: StageClock | None = None) -> None:
        """`clock`: the watchdog's deadlines (run.hang_*): a hand-over unanswered past the longest recent ones
        times run.hang_factor means its reward actor hangs (frozen, or stuck outside its killable scoring process)."""
        self.scorers, self.counters, self._put, self._count_reward_failures = scorers, counters, put, count_failures
        self.clock = clock or StageClock()
        self.scoring: dict = {}  # a score call in flight -> what was handed over
        self.retries: list[tuple[float, _HandOff]] = []  # (when, hand-over) to send again after its actor failed
        self.killed: dict[int, float] = {}  # reward actor -> when this worker last restarted it as hung
        self.restarting: set[int] = set()  # actors restarted that have not answered since: run.hang_first_s, like a first call

    def __len__(self) -> int:
        """Groups handed over and not yet delivered (in flight or waiting to be sent again)."""
        return len(self.scoring) + len(self.retries)

    def hand_off(self, records: list[dict], prompt: Prompt) -> None:
        """Give a finished group to its prompt's reward actor (so repeats of a prompt meet its cache)."""
        self._send(_HandOff(records, prompt, route(prompt.prompt_id, len(self.scorers))))

    def _actor(self, hand: _HandOff) -> int:
        return (hand.route + hand.tries) % len(self.scorers)  # a retry goes to the next actor

    def _send(self, hand: _HandOff) -> None:
        hand.sent = time.monotonic()
        self.scoring[self.scorers[self._actor(hand)].score.remote(hand.records, hand.prompt)] = hand

    def check(self, timeout_s: float = 0.0) -> None:
        """Take the answers of the reward actors that delivered their groups; send again, after a back-off and to
        the next actor, a group whose call failed because its actor died or is restarting."""
        now = time.monotonic()
        for due, hand in [r for r in self.retries if r[0] <= now]:
            self.retries.remove((due, hand))
            self._send(hand)
        if not self.scoring:
            return
        done, waiting = ray.wait(list(self.scoring), num_returns=len(self.scoring), timeout=timeout_s)
        self._watch(waiting)
        for ref in done:
            hand = self.scoring.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self._failed(hand, f"its reward actor died before delivering it ({type(exc).__name__}, {hand.tries + 1} tries)")
                continue
            if (i := self._actor(hand)) in self.restarting:
                self.restarting.discard(i)  # back: its start-up was not a hand-over's time
            else:
                self.clock.record("reward hand-over", time.monotonic() - hand.sent)
            if result.duplicate:
                continue
            timeouts = sum(f.startswith("reward timed out") for f in result.failures)
            self.counters.reward_timeouts += timeouts
            self.counters.reward_errors += len(result.failures) - timeouts
            self._count_reward_failures(result.all_failed, result.failures[-1] if result.failures else "")

    def _watch(self, waiting: list) -> None:
        """The watchdog: a hand-over unanswered past its deadline means its reward actor hangs. The actor is killed
        (Ray restarts it, reward.max_restarts) and the group sent again to the next actor; the report is logged."""
        now, learned = time.monotonic(), self.clock.deadline("reward hand-over")
        for ref in waiting:
            hand = self.scoring[ref]
            i = self._actor(hand)
            deadline = self.clock.first_s if i in self.restarting else learned
            if now - hand.sent < deadline:
                continue
            del self.scoring[ref]
            if now - self.killed.get(i, -deadline) >= deadline:  # one restart per hang, whatever the groups it held
                self.killed[i] = now
                self.restarting.add(i)
                self.counters.reward_hangs += 1
                report = hung_message(f"reward actor {i}", "score", now - hand.sent, self.clock, "reward hand-over",
                                      f"a group of prompt {hand.prompt.prompt_id}")
                print(f"asyncrl: WATCHDOG {report}; restarting it and handing its groups to the next actor", flush=True)
                ray.kill(self.scorers[i], no_restart=False)
            self._failed(hand, f"its reward actor hung (no answer in {now - hand.sent:.0f} s, {hand.tries + 1} tries)")

    def _failed(self, hand: _HandOff, reason: str) -> None:
        hand.tries += 1
        if hand.tries < SCORING_TRIES:
            self.counters.scoring_retries += 1
            self.retries.append((time.monotonic() + min(2.0 ** hand.tries, 30.0), hand))
            return
        for r in hand.records:
            r.update(status=Status.DROPPED_ERROR.value, status_reason=reason, t_scored=time.time())
        self.counters.reward_errors += len(hand.records)
        self._put(hand.records)
        self._count_reward_failures(True, reason)

    def finish(self, timeout_s: float) -> list[dict]:
        """At stop: wait up to `timeout_s` for the groups being scored (or waiting to be sent again); those still
        there are returned, marked aborted."""
        deadline = time.monotonic() + timeout_s
        while (self.scoring or self.retries) and time.monotonic() < deadline:
            self.check(min(1.0, deadline - time.monotonic()))
            if not self.scoring:
                time.sleep(0.05)
        records = [r for hand in [*self.scoring.values(), *(h for _, h in self.retries)] for r in hand.records]
        for r in records:
            r.update(status=Status.ABORTED_AT_END.value, status_reason="run stopped while its group was being scored")
        self.scoring.clear()
        self.retries.clear()
        return records


def route(prompt_id: str, n: int) -> int:
    """The reward actor of a prompt: the same one every time (its cache sees the prompt's repeats), spread evenly."""
    return zlib.crc32(prompt_id.encode()) % n
