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
from asyncrl.core.deadlines import StageClock, StageTimeout, hung_message
from asyncrl.core.weights import new_secret
from asyncrl.orchestration.cluster import in_pool


WRITES = frozenset({"save", "save_checkpoint", "save_policy"})
"""Calls that write to storage, whose time follows the disk's, not the last call's: the watchdog gives each
run.hang_first_s."""


class LearnerPool:
    def __init__(self, cfg: Config, pg: PlacementGroup, model_paths: list[str]) -> None:
        """learner.num_workers ranks, rank i in bundle i, reading the model from `model_paths[i]` (its node's copy)."""
        l = cfg.learner
        opts = {"num_cpus": l.num_cpus, "num_gpus": l.num_gpus, "resources": l.resources}
        self.cfg = cfg
        self.clock = StageClock(cfg.run.hang_factor, cfg.run.hang_floor_s, cfg.run.hang_first_s)  # the watchdog's
        self.model_path = model_paths[0]  # rank 0's: the tokenizer and config a saved policy is written with
        self.actors = [ray.remote(Learner).options(**opts, scheduling_strategy=in_pool(pg, i)).remote(cfg, model_paths[i], i)
                       for i in range(l.num_workers)]

    def call(self, method: str, *args):
        """Call `method` on every learner rank (FSDP2: gathering or saving the weights is a collective); rank 0's result.
        The watchdog (asyncrl.core.deadlines) gives each method a deadline from its own recent calls: a rank that has
        not answered by then stops the run with a StageTimeout naming the ranks, the call and the deadline."""
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        t0 = time.monotonic()
        deadline = self.clock.first_s if method in WRITES else self.clock.deadline(method)
        _, waiting = ray.wait(refs, num_returns=len(refs), timeout=deadline)
        if waiting:
            ranks = [i for i, ref in enumerate(refs) if ref in waiting]
            report = hung_message(f"learner rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}", method,
                                  time.monotonic() - t0, self.clock, method)
            print(f"asyncrl: WATCHDOG {report}; stopping the run (resume it from its last checkpoint)", flush=True)
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
