"""The rollout workers in their placement group: started, asked for their counters, replaced when one dies; the
reward actors in theirs.

A dead worker is reported by `stats`; `retire` and `restart` replace it where it stopped (its lost groups are
recorded by the buffer, the replacement continues its prompt stream and group numbering). What the replacement
needs from the weight sync (the group rebuilt, the current version) is arranged by the fleet (asyncrl/orchestration/fleet.py).
"""
from __future__ import annotations

import ray
from ray.util.placement_group import PlacementGroup

from asyncrl.actors.engines import engine_runtime_env
from asyncrl.actors.reward import RewardWorker
from asyncrl.actors.rollout import RolloutWorker
from asyncrl.core.config import Config
from asyncrl.core.messages import RewardStats, WorkerStats
from asyncrl.orchestration.cluster import in_pool


class RolloutPool:
    def __init__(self, cfg: Config, pg: PlacementGroup, model_paths: list[str], buffer, run_id: str, cursors: dict[int, int],
                 scorers: list | None = None) -> None:
        self.cfg, self.pg, self.model_paths, self.buffer, self.run_id = cfg, pg, model_paths, buffer, run_id
        self.scorers = scorers or []  # the reward pool's actors, handed to every worker (and to replacements)
        self.cursors = cursors  # prompts drawn per worker before this process (a resumed run)
        self.cursor_offsets: dict[int, int] = {}  # prompts drawn in this process by worker i's earlier incarnations
        self.restarts = 0
        self.workers = [self._new(i, cursors.get(i, 0), 0) for i in range(cfg.rollout.num_workers)]

    def _new(self, i: int, cursor: int, first_group: int):
        r = self.cfg.rollout
        opts = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus, "resources": r.resources, "max_concurrency": 4}
        runtime_env = engine_runtime_env(r.engine, on_gpu=r.num_gpus > 0)
        if runtime_env:  # merged by Ray over the job's runtime_env (its working_dir, env_vars)
            opts["runtime_env"] = runtime_env
        return (ray.remote(RolloutWorker).options(**opts, scheduling_strategy=in_pool(self.pg, i))
                .remote(i, self.cfg, self.model_paths[i], self.buffer, self.run_id, cursor, first_group, self.scorers))

    def stats(self, timeout_s: float = 60.0) -> tuple[list[WorkerStats], list[tuple[int, str]]]:
        """Every worker's counters, or ([], the dead: (index, why)) when some did not answer."""
        refs = [w.stats.remote() for w in self.workers]
        dead = []
        for i, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                dead.append((i, type(exc).__name__))
        return ([], dead) if dead else (ray.get(refs), [])

    def retire(self, i: int, why: str) -> None:
        """Worker i is gone: count the restart (a RuntimeError past rollout.max_restarts) and make sure it is dead."""
        self.restarts += 1
        if self.restarts > self.cfg.rollout.max_restarts:
            raise RuntimeError(f"rollout worker {i} died ({why}); rollout.max_restarts={self.cfg.rollout.max_restarts} restarts used up")
        ray.kill(self.workers[i], no_restart=True)

    def restart(self, i: int, why: str) -> bool:
        """Record the groups worker i took with it and start its replacement where it stopped; False if the
        replacement died while starting (retire it again)."""
        reason = f"rollout worker {i} died while generating this group ({why})"
        groups = ray.get(self.buffer.forfeit.remote(i, self.run_id, self.cfg.rollout.group_size, reason))
        print(f"asyncrl: rollout worker {i} died ({why}); restarting it (restart {self.restarts})", flush=True)
        # every admitted group drew one prompt: the replacement continues the stream and the group numbering
        self.workers[i] = self._new(i, self.cursors.get(i, 0) + groups, groups)
        self.cursor_offsets[i] = groups
        try:  # its engine is up before the weight group is rebuilt around it (a rank missing there stalls everyone)
            ray.get(self.workers[i].node_id.remote())
        except ray.exceptions.RayActorError:
            return False
        return True

    def prompt_cursors(self, stats: list[WorkerStats]) -> dict[str, int]:
        """Prompts drawn by each worker over the whole run, for a checkpoint."""
        return {str(st.worker_id): self.cursors.get(st.worker_id, 0) + self.cursor_offsets.get(st.worker_id, 0) + st.prompts_drawn
                for st in stats}


class RewardPool:
    """The reward actors in their own placement group (reward.num_workers of them; none: rollout workers score
    in their loops). Ray restarts one whose process died (reward.max_restarts); the groups it held are recorded
    by the rollout workers that handed them over."""

    def __init__(self, cfg: Config, pg: PlacementGroup | None, buffer) -> None:
        rw = cfg.reward
        opts = {"num_cpus": rw.num_cpus, "num_gpus": rw.num_gpus, "resources": rw.resources, "max_restarts": rw.max_restarts,
                "max_concurrency": 1000}  # one pending call per group waiting to be scored
        place = (lambda i: {"scheduling_strategy": in_pool(pg, i)}) if pg is not None else (lambda i: {})  # no group: anywhere
        self.actors = [ray.remote(RewardWorker).options(**opts, **place(i)).remote(i, cfg, buffer) for i in range(rw.num_workers)]
        ray.get([a.node_id.remote() for a in self.actors])  # up (their reward imports) before any group is handed over

    def stats(self, timeout_s: float = 30.0) -> list[RewardStats]:
        """Each live actor's counters (one being restarted is left out this time)."""
        out = []
        for ref in [a.stats.remote() for a in self.actors]:
            try:
                out.append(ray.get(ref, timeout=timeout_s))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue
        return out

    def close(self) -> None:
        """Kill every scoring child process (the actors themselves are killed with the rest)."""
        refs = [a.close.remote() for a in self.actors]
        try:
            ray.get(refs, timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
