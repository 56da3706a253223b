"""The fleet: every actor of a run, built from one Config, placed, and kept serving on the current weights.

The replay buffer runs on the driver's node; the learner ranks, the rollout workers and the reward actors each in
their own placement group, with the model on every node they landed on (cluster.py). The weight group joins learner
rank 0 and every engine (weight_sync.py): a version is published without waiting for the engines to load it, and at
most one is in flight. A rollout worker whose process died is replaced where it stopped (pools.py), the group is
rebuilt around the replacement, and it gets the current version. When to publish is the controller's.

The rollout pool grows and shrinks while the run goes (`want`; asyncrl.core.elastic), one change at a time and at
the top. A new worker starts on a thread while the run goes on; a removed one stops admitting and finishes what
it holds. Both take effect at a version boundary (`publish_next`): the weight group is re-formed with the workers
serving from then on and the version about to be published reaches all of them in the same broadcast, so no
engine is left on another version and nothing is sent twice; a joiner starts generating once it has loaded it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from asyncrl.actors.buffer import ReplayBuffer
from asyncrl.core.config import Config
from asyncrl.core.fingerprint import WeightMismatch
from asyncrl.core.messages import WorkerStats
from asyncrl.core.models.cache import ModelSource
from asyncrl.orchestration.cluster import bundle_nodes, place_model, resource_pool
from asyncrl.orchestration.learners import LearnerPool
from asyncrl.orchestration.elastic import ElasticPool
from asyncrl.orchestration.pools import RewardPool, RolloutPool
from asyncrl.orchestration.weight_sync import WeightSync


class Fleet:
    def __init__(self, cfg: Config, run_dir: Path, model: ModelSource, run_id: str, cursors: dict[int, int]) -> None:
        """Build and place every actor; `cursors`: the prompts each rollout worker drew before (a resumed run)."""
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.buffer = ray.remote(ReplayBuffer).options(num_cpus=0, scheduling_strategy=here).remote(cfg, str(run_dir / "trajectories"))
        l, r = cfg.learner, cfg.rollout
        # separate pools, so that on a cluster the two land where their resources are
        self.pools = [resource_pool("learner", l.num_workers, l.num_cpus, l.num_gpus, l.resources),
                      resource_pool("rollout", r.num_workers, r.num_cpus, r.num_gpus, r.resources)]
        rw = cfg.reward
        if rw.num_workers:
            self.pools.append(resource_pool("reward", rw.num_workers, rw.num_cpus, rw.num_gpus, rw.resources))
        self.rewards = RewardPool(cfg, self.pools[2] if rw.num_workers else None, self.buffer)
        nodes = [bundle_nodes(pg) for pg in self.pools[:2]]
        paths = place_model(model, {n for pool in nodes for n in pool})
        self.learner_pool = LearnerPool(cfg, self.pools[0], [paths[n] for n in nodes[0]])
        self.rollout = RolloutPool(cfg, self.pools[1], [paths[n] for n in nodes[1]], self.buffer, run_id, cursors, self.rewards.actors)
        self.cfg = cfg
        self.sync = WeightSync(self.learner_pool.actors, cfg)
        self.on_mismatch = cfg.learner.on_weight_mismatch
        self.mismatches = 0  # engines found serving other weights than were sent, over the run
        self.watchdog: list[str] = []  # the watchdog's reports, over the run
        self.created_t = time.time()  # the actors exist (their engines may still be starting)
        self.version = 0  # the policy version last published
        self.on_replaced: Callable[[int], None] = lambda i: None  # told the index of every rollout worker replaced or removed
        self.on_left: Callable[[WorkerStats], None] = lambda stats: None  # told a removed worker's last counters
        self.elastic = ElasticPool(cfg, self.rollout, model, gone=lambda i: self.on_replaced(i), left=lambda st: self.on_left(st))
        self.step = 0  # the learner step under way (the controller's; for the pool changes' records)
        self.placement = {
            "learner_nodes": ray.get([a.node_id.remote() for a in self.learner_pool.actors]),
            "rollout_nodes": ray.get([w.node_id.remote() for w in self.workers]),
        }
        if len(self.learner_pool.actors) > 1:
            self.learner_pool.init_group(self.rendezvous())

    @property
    def workers(self) -> list:
        return self.rollout.workers

    def connect(self) -> None:
        """(Re)build the weight group of learner rank 0 and every engine."""
        self.sync.connect(self.workers, self.rendezvous())

    def publish_next(self) -> dict:
        """Settle the version in flight (`settle_weights`), let the pool's joiners and leavers change places (the
        weight group re-formed), then publish the learner's weights as the next version without waiting for the
        engines to load it (a joiner's load is waited for: it starts generating on it): `seconds` on the caller's
        path, `settle_s` of it settling, `pool_s` changing the pool."""
        t0 = time.perf_counter()
        settled = self.settle_weights()
        waited = time.perf_counter() - t0
        change = self.elastic.change
        joined, regroup = self.elastic.boundary(self.step)
        if regroup:
            self.placement["rollout_nodes"] = ray.get([w.node_id.remote() for w in self.workers])  # where to rendezvous
            self.connect()
        pool_s = time.perf_counter() - t0 - waited
        self.version += 1
        sent = self._publish()
        if joined:
            t1 = time.perf_counter()
            self.settle_weights()
            ray.get([self.workers[i].start.remote() for i in joined])
            self.elastic.change_done(self.step)
            pool_s += time.perf_counter() - t1
        if change is not None:
            change.boundary_s += pool_s
        return {"seconds": time.perf_counter() - t0, "settle_s": waited, "pool_s": pool_s, **settled, **sent}

    def _publish(self) -> dict:
        sent = self.sync.publish(self.workers, self.version)
        self.buffer.set_version.remote(self.version)  # the buffer's calls run in the order they were sent
        for i, report in self.sync.stuck:  # frozen before it took the broadcast: killed (which breaks the broadcast
            self._hung(i, report)          # for the rest), replaced, and the version sent to everyone again
        return sent

    def _hung(self, i: int, report: str) -> None:
        print(f"asyncrl: WATCHDOG {report}; replacing it", flush=True)
        self.watchdog.append(report)
        self.replace_worker(i, f"hung: {report}")

    def settle_weights(self, again: bool = False) -> dict:
        """Block until every engine has loaded the version in flight; replace the ones that died doing it; act on
        the ones that serve other weights than were sent (`learner.on_weight_mismatch`; `again`: this is the
        version sent a second time)."""
        settled = self.sync.collect()
        for i in settled.dead:  # rebuilds the group and publishes again, to everyone
            self.replace_worker(i, "died during a weight update")
        for i, report in settled.hung:  # replaced as a dead one is: killed, its groups recorded, the group rebuilt
            self._hung(i, report)
        self.mismatches += len(settled.mismatched)
        for m in settled.mismatched:
            print(f"asyncrl: WEIGHT MISMATCH {m}{' (sent twice)' if again else ''}; learner.on_weight_mismatch={self.on_mismatch}", flush=True)
        if not settled.mismatched:
            return settled.metrics()
        learner_side = [m for m in settled.mismatched if m.mismatch.learner_side]  # no engine can fix: stop, whatever the action
        if learner_side or self.on_mismatch == "stop" or (self.on_mismatch == "resend" and again):
            first = (learner_side or settled.mismatched)[0]
            raise WeightMismatch(first.engine, first.version, first.mismatch, again=again)
        if self.on_mismatch == "resend":
            self._publish()  # the same version, to every engine (a broadcast reaches the whole group)
            return {**settled.metrics(), **self.settle_weights(again=True), "mismatches": len(settled.mismatched)}
        for m in settled.mismatched:
            self.replace_worker(m.engine, f"served other weights than were sent: {m.mismatch.describe()}")
        return settled.metrics()

    def worker_stats(self) -> list[WorkerStats]:
        """Every worker's counters; a worker whose process died is replaced first (and its lost groups recorded)."""
        while True:
            stats, dead = self.rollout.stats()
            if not dead:
                return stats
            for i, why in dead:
                self.replace_worker(i, why)

    def replace_worker(self, i: int, why: str) -> None:
        """Rollout worker i is gone: record what it took with it, start a replacement where it stopped, rebuild the
        weight group around it and give it the current version. The worker being removed from the pool is not
        replaced: it leaves (ElasticPool.leave)."""
        if self.elastic.is_retiring(i):
            self.sync.collect(skip=i)
            self.elastic.leave(f"rollout worker {i} died while being removed from the pool ({why})", self.step)
            self.placement["rollout_nodes"] = self.placement["rollout_nodes"][:i]
            self.connect()
            self._publish()  # a broadcast it broke reached none of the others: they get the version again
            self.settle_weights()
            return
        self.rollout.retire(i, why)
        self.sync.collect(skip=i)  # the others finish loading the version in flight before the group is rebuilt
        if not self.rollout.restart(i, why):
            self.replace_worker(i, "died while starting")  # bounded by rollout.max_restarts
            return
        self.on_replaced(i)  # its counters start again from 0
        self.connect()
        self._publish()
        self.settle_weights()  # the replacement starts generating from the current version
        ray.get(self.workers[i].start.remote())

    def restart_learners(self) -> None:
        """A new learner group in place of a lost one (its ranks killed and started again from the initial model,
        joined into one group), and a new weight sync around it; the caller loads the checkpoint and connects."""
        self.sync.abandon()
        self.learner_pool.restart(self.rendezvous())
        self.placement["learner_nodes"] = ray.get([a.node_id.remote() for a in self.learner_pool.actors])
        self.sync = WeightSync(self.learner_pool.actors, self.cfg)

    def rendezvous(self) -> str:
        """Loopback when everything runs on one node, else the learner rank 0's node address."""
        one_node = len({*self.placement["learner_nodes"], *self.placement["rollout_nodes"]}) == 1
        return "127.0.0.1" if one_node else ray.get(self.learner_pool.actors[0].node_ip.remote())

    def shutdown(self) -> None:
        self.elastic.shutdown()
        self.rewards.close()
        for actor in [*self.workers, *self.learner_pool.actors, *self.rewards.actors, self.buffer]:
            ray.kill(actor)
        for pg in self.pools:
            remove_placement_group(pg)
