"""ReplayBuffer: staleness-bounded, capacity-bounded, and the recorder of every sample's fate.

An asyncio Ray actor. Rollout workers ask `admit` before starting groups and
`put` finished groups; the learner's batches come from `get_batch`, which
never returns a sample past `buffer.max_staleness` (those are dropped and
counted). A group is judged whole, by its oldest `policy_version_start`:
samples of one group can start at different versions (rollout.weight_update
=abort resubmits only the unfinished ones) and GRPO needs the group intact.
With `algorithm.filter_zero_variance` a group whose (shaped) rewards are all
equal is recorded as `filtered` when it arrives and frees its admission, so
another group is started in its place and batches stay full (DAPO's dynamic
sampling); the staleness bound still judges every group that is trained on.
A batch at the last step of a version waits (up to `buffer.expiring_wait_s`) for a group still being generated
that this version is the last allowed to train on, rather than leave it to be dropped as stale (staleness.py).
Every sample ends here in exactly one status, written to the trajectory store.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

from asyncrl.core.config import Config
from asyncrl.core.deliveries import Deliveries
from asyncrl.core.messages import GroupId
from asyncrl.core.schema import Status, new_sample
from asyncrl.core.shaping import shaped_reward, zero_variance
from asyncrl.core.staleness import admissible, oldest_start, split_stale, take_batch, waits_for_expiring
from asyncrl.core.store import TrajectoryStore


class ExpiringWaits:
    """How long each batch has waited for an expiring group (up to `limit_s`, over all its calls), and the totals."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.current: tuple[int, float] | None = None  # (step, since when) its batch has waited
        self.batches, self.seconds = 0, 0.0

    def left(self, step: int, waits: bool) -> float:
        """Seconds the batch of `step` goes on waiting where it `waits`: 0 when it need not, or its time is up."""
        if self.limit_s <= 0 or not waits:
            return 0.0
        if self.current is None or self.current[0] != step:
            self.current = (step, time.monotonic())
        return max(0.0, self.limit_s - (time.monotonic() - self.current[1]))

    def restore(self, counts: dict) -> dict:
        """Resume the totals a checkpoint's buffer counts hold (none in one written before they were kept); returns
        the other counts."""
        rest = dict(counts)
        self.batches, self.seconds = int(rest.pop("expiring_wait_batches", 0)), float(rest.pop("expiring_wait_s", 0.0))
        return rest

    def taken(self, step: int) -> None:
        """The batch of `step` was taken: count its wait, if it waited."""
        if self.current is not None and self.current[0] == step:
            self.batches += 1
            self.seconds += time.monotonic() - self.current[1]
            self.current = None


class ReplayBuffer:
    def __init__(self, cfg: Config, store_dir: str) -> None:
        self.cfg = cfg
        self.max_staleness = cfg.buffer.max_staleness
        self.capacity = cfg.buffer.capacity_groups
        self.groups_per_version = cfg.groups_per_step * cfg.learner.sync_every
        self.store = TrajectoryStore(store_dir, flush_s=cfg.buffer.store_flush_s)
        self.groups: deque[list[dict]] = deque()
        self.version = 0
        self.live = 0  # admitted and not dropped
        self.outstanding = 0  # admitted, not yet consumed or dropped
        self.counts = {"admitted_groups": 0, "refused_admissions": 0, "consumed": 0, "dropped_stale": 0, "dropped_error": 0, "aborted": 0,
                       "lost": 0, "filtered": 0}
        self.deliveries = Deliveries()  # so a group delivered twice is recorded once, and a dead worker's are named
        self.changed = asyncio.Condition()
        self.worker_versions: dict[int, int] = {}  # the version each worker's engine last said it holds
        self.epochs: dict[int, int] = {}  # per worker id: how many times a worker of that id was declared dead
        self.expiring = ExpiringWaits(cfg.buffer.expiring_wait_s)

    async def admit(self, requested: int, worker_id: int = 0, worker_version: int | None = None, wait_s: float = 0.0) -> int:
        """How many of `requested` groups worker `worker_id` may start now; where none may, wait up to `wait_s` for
        that to change (a version published, a group consumed or dropped, the worker's new weights loaded: `loaded`)
        instead of being asked again and again. `worker_version`: the version its engine holds (a worker whose
        weights are older than the bound allows is not admitted: what it started would be stale)."""
        if worker_version is not None:
            self.worker_versions[worker_id] = worker_version
        epoch = self.epochs.get(worker_id, 0)
        deadline = time.monotonic() + wait_s
        async with self.changed:
            while True:
                if self.epochs.get(worker_id, 0) != epoch:  # the worker stopped or was declared dead meanwhile
                    return 0
                n = admissible(requested, self.live, self.outstanding, self.version, self.max_staleness, self.groups_per_version,
                               self.capacity, self.worker_versions.get(worker_id))
                remaining = deadline - time.monotonic()
                if n or remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(self.changed.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        self.deliveries.admitted(worker_id, n, None if worker_version is None else self.worker_versions[worker_id])
        self.live += n
        self.outstanding += n
        self.counts["admitted_groups"] += n
        self.counts["refused_admissions"] += int(n < requested)
        return n

    async def loaded(self, worker_id: int, version: int) -> None:
        """Worker `worker_id`'s engine now holds `version` (its admission call may be waiting for it)."""
        self.worker_versions[worker_id] = version
        await self._notify()

    async def release(self, worker_id: int) -> None:
        """Worker `worker_id` stopped: an admission call it left waiting answers now, admitting nothing (instead of
        holding the worker's stop until its wait runs out)."""
        self.epochs[worker_id] = self.epochs.get(worker_id, 0) + 1
        await self._notify()

    async def set_version(self, version: int) -> None:
        self.version = version
        await self._notify()

    async def _notify(self) -> None:
        """Wake the calls waiting for the buffer to change (admissions, batches)."""
        async with self.changed:
            self.changed.notify_all()

    async def put(self, group: list[dict]) -> None:
        if not self.deliveries.first(group):
            return  # delivered twice (e.g. late from a worker already declared dead): ids make delivery idempotent
        if group[0]["status"] == Status.DROPPED_ERROR.value:
            self._drop(group, Status.DROPPED_ERROR)
            await self._notify()  # its admission is free again
            return
        if self.cfg.algorithm.filter_zero_variance and self._filter(group):
            await self._notify()
            return
        async with self.changed:
            self.groups.append(group)
            self.changed.notify_all()

    async def get_batch(self, n_groups: int, version: int, step: int, timeout_s: float) -> list[dict] | None:
        """`n_groups` fresh groups (the oldest first with buffer.oldest_first, else in arrival order), marked consumed
        at `version`; None on timeout."""
        deadline = time.monotonic() + timeout_s
        async with self.changed:
            while True:
                self._drop_stale(version)
                hold = self._expiring_wait_left(n_groups, version, step) if len(self.groups) >= n_groups else 0.0
                if len(self.groups) >= n_groups and not hold:
                    taken, rest = take_batch(self.groups, n_groups, self.cfg.buffer.oldest_first)
                    self.groups = deque(rest)
                    batch = self._consume(taken, version, step)
                    self.changed.notify_all()  # room in the buffer again (and any stale groups dropped above)
                    return batch
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                remaining = min(remaining, hold) if hold else remaining
                try:
                    await asyncio.wait_for(self.changed.wait(), remaining)
                except asyncio.TimeoutError:
                    pass

    def _expiring_wait_left(self, n_groups: int, version: int, step: int) -> float:
        """Seconds the batch of `step` goes on waiting for an expiring group still in flight (staleness.py)."""
        waits = self.expiring.limit_s > 0 and waits_for_expiring(  # the wait off (0 s): nothing to look at
            self.deliveries.in_flight(), [oldest_start(g) for g in self.groups], version, self.max_staleness, n_groups,
            (step + 1) % self.cfg.learner.sync_every == 0)  # the last batch at this version
        return self.expiring.left(step, waits)

    async def record_final(self, records: list[dict]) -> None:
        """Samples that end outside the buffer (aborted at shutdown), already carrying a status."""
        groups = {r["group_id"] for r in records}
        fresh = {g for g in groups if self.deliveries.first([r for r in records if r["group_id"] == g])}
        records = [r for r in records if r["group_id"] in fresh]
        self.outstanding -= len({r["group_id"] for r in records})
        self.live -= len({r["group_id"] for r in records})
        self.counts["aborted"] += len(records)
        self.store.append(records)
        await self._notify()

    async def flush(self) -> int:
        """Write every pending record now (before a checkpoint); returns rows written so far."""
        self.store.flush()
        return self.store.rows_written

    async def restore(self, version: int, consumed_groups: int, counts: dict) -> None:
        """Resume: the run's accounting at a checkpoint, with nothing in flight (admission continues from there)."""
        self.version = version
        self.live, self.outstanding = consumed_groups, 0
        self.counts.update(self.expiring.restore(counts))
        await self._notify()

    async def stats(self) -> dict:
        return {**self.counts, "buffered_groups": len(self.groups), "outstanding_groups": self.outstanding, "version": self.version,
                "expiring_wait_batches": self.expiring.batches, "expiring_wait_s": self.expiring.seconds}

    async def close(self) -> dict:
        """Record what is still buffered as unconsumed and flush the store."""
        leftover = [s for g in self.groups for s in g]
        for s in leftover:
            s.update(status=Status.UNCONSUMED_AT_END.value, status_reason="run stopped before it was trained on")
        self.groups.clear()
        self.store.append(leftover)
        self.store.flush()
        return {**self.counts, "unconsumed": len(leftover), "rows_written": self.store.rows_written}

    async def forfeit(self, worker_id: int, run_id: str, group_size: int, reason: str) -> int:
        """A worker died: record each group it was admitted for and never delivered as dropped_error with
        `reason` (sample ids as the worker would have named them), and free their admissions.
        Returns the worker's group count, where its replacement continues numbering and its prompt stream."""
        self.epochs[worker_id] = self.epochs.get(worker_id, 0) + 1  # an admission it left waiting admits nothing
        self.worker_versions.pop(worker_id, None)
        admitted, lost = self.deliveries.forfeit(worker_id)
        for k in lost:
            gid = GroupId(run_id, worker_id, k)
            records = [new_sample(run_id=run_id, sample_id=gid.sample_id(i), group_id=str(gid), worker_id=worker_id,
                                  status=Status.DROPPED_ERROR.value, status_reason=reason) for i in range(group_size)]
            self._drop(records, Status.DROPPED_ERROR)
            self.counts["lost"] += len(records)
        await self._notify()
        return admitted

    def _filter(self, group: list[dict]) -> bool:
        """Record the group as filtered if its rewards (as the learner would see them) are all equal."""
        rewards = [shaped_reward(s, self.cfg.algorithm, self.cfg.rollout.max_new_tokens) for s in group]
        if not zero_variance(rewards):
            return False
        self._drop(group, Status.FILTERED, f"all {len(group)} rewards equal {rewards[0]:g}")
        return True

    def _drop(self, group: list[dict], status: Status, reason: str | None = None) -> None:
        """Record the group as ended in `status` (stamped on its samples with `reason`, where given: else they carry
        it already), counted under its name, and free its admission."""
        if reason is not None:
            for s in group:
                s.update(status=status.value, status_reason=reason)
        self.live -= 1
        self.outstanding -= 1
        self.counts[status.value] += len(group)
        self.store.append(group)

    def _drop_stale(self, version: int) -> None:
        fresh, stale = split_stale(self.groups, version, self.max_staleness)
        self.groups = deque(fresh)
        for group, reason in stale:
            self._drop(group, Status.DROPPED_STALE, reason)

    def _consume(self, groups: list[list[dict]], version: int, step: int) -> list[dict]:
        now = time.time()
        self.expiring.taken(step)
        batch = [s for g in groups for s in g]
        for s in batch:
            s.update(status=Status.CONSUMED.value, consumed_version=version, consumed_step=step, t_consumed=now)
        self.outstanding -= len(groups)
        self.counts["consumed"] += len(batch)
        self.store.append(batch)
        return batch
