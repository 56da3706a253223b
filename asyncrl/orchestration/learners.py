"""The learner ranks in their placement group: started, called together, joined into one group, checkpointed.

Every rank takes part in gathering or saving the weights (FSDP2: a collective), so those calls go to all of them
and rank 0's result stands for the group; rank 0 alone publishes the weights (weight_sync.py).
"""
from __future__ import annotations

import time
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup

from asyncrl.actors.learner import Learner
from asyncrl.core.checkpoint import CHECKPOINT_HF_DIR
from asyncrl.core.config import Config
from asyncrl.core.deadlines import LearnerLost, StageClock, StageTimeout, hung_message
from asyncrl.core.weights import new_secret
from asyncrl.orchestration.cluster import in_pool


WRITES = frozenset({"save", "save_checkpoint", "save_policy"})
"""Calls that write to storage, whose time follows the disk's, not the last call's: the watchdog gives each
run.hang_first_s."""


def _dead_rank(refs: list, wait_s: float = 10.0) -> int | None:
    """The first rank whose call ended with its process dead, waiting up to `wait_s` for the others to end."""
    ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    for i, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError:
            return i
        except Exception:  # its own error, or not ended: not a dead process
            continue
    return None


class LearnerPool:
    def __init__(self, cfg: Config, pg: PlacementGroup, model_paths: list[str]) -> None:
        """learner.num_workers ranks, rank i in bundle i, reading the model from `model_paths[i]` (its node's copy)."""
        self.cfg, self.pg, self.model_paths = cfg, pg, model_paths
        self.clock = StageClock(cfg.run.hang_factor, cfg.run.hang_floor_s, cfg.run.hang_first_s)  # the watchdog's
        self.model_path = model_paths[0]  # rank 0's: the tokenizer and config a saved policy is written with
        self.actors = self._start()

    def _start(self) -> list:
        l = self.cfg.learner
        opts = {"num_cpus": l.num_cpus, "num_gpus": l.num_gpus, "resources": l.resources}
        return [ray.remote(Learner).options(**opts, scheduling_strategy=in_pool(self.pg, i)).remote(self.cfg, self.model_paths[i], i)
                for i in range(l.num_workers)]

    def restart(self, host: str) -> None:
        """A new group in the same bundles: every rank killed (the survivors of a lost rank are stuck in its
        collectives) and started from the initial model, joined again (`init_group`, rendezvousing at `host`)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = self._start()
        if len(self.actors) > 1:
            self.init_group(host)

    def call(self, method: str, *args):
        """Call `method` on every learner rank (FSDP2: gathering or saving the weights is a collective); rank 0's result.
        The watchdog (asyncrl.core.deadlines) gives each method a deadline from its own recent calls: a rank that has
        not answered by then raises a StageTimeout naming the ranks, the call and the deadline. A rank whose process
        died raises LearnerLost at once (the others would wait in its collectives)."""
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        t0 = time.monotonic()
        deadline = self.clock.first_s if method in WRITES else self.clock.deadline(method)
        waiting = list(refs)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1, timeout=max(0.0, deadline - (time.monotonic() - t0)))
            if not ready:
                break
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:
                raise LearnerLost(f"learner rank {refs.index(ready[0])} died during {method} ({type(exc).__name__})") from None
            except ray.exceptions.RayTaskError:  # its own error, or a collective broken by a rank that died
                if (dead := _dead_rank(refs)) is not None:
                    raise LearnerLost(f"learner rank {dead} died during {method}") from None
                raise
        if waiting:
            ranks = [i for i, ref in enumerate(refs) if ref in waiting]
            report = hung_message(f"learner rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}", method,
                                  time.monotonic() - t0, self.clock, method)
            print(f"asyncrl: WATCHDOG {report}", flush=True)
            raise StageTimeout(report)
        if method not in WRITES:
            self.clock.record(method, time.monotonic() - t0)
        return ray.get(refs)[0]

    def init_group(self, host: str) -> None:
        """Join the ranks into one process group (several ranks shard the model), rendezvousing at `host`."""
        port, name = ray.get(self.actors[0].pick_port.remote(host)), f"asyncrl-learners-{new_secret()}"
        ray.get([a.init_learner_group.remote(host, port, i, len(self.actors), name) for i, a in enumerate(self.actors)])

    def save_checkpoint(self, directory: Path) -> None:
        """The learner's part of a checkpoint: its shards (every rank writes its own) and, with run.checkpoint_hf, the
        policy as a Hugging Face directory in hf/ (written as the final model is)."""
        self.call("save_checkpoint", str(directory))
        if self.cfg.run.checkpoint_hf:
            self.call("save", str(directory / CHECKPOINT_HF_DIR), self.model_path)

    def load_checkpoint(self, directory: Path) -> None:
        ray.get([a.load_checkpoint.remote(str(directory)) for a in self.actors])
