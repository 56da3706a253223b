"""Episodes played outside training (RolloutWorker.episodes: evaluation with env.name or env.agent) by a
generation loop of their own: the same engine, episode drivers and tools as the training loop, one group of one
sample per prompt, nothing admitted, scored or put."""
from __future__ import annotations

from asyncrl.actors.rollout.flight import Flight
from asyncrl.actors.rollout.loop import GenerationLoop
from asyncrl.actors.rollout.records import episode_fields
from asyncrl.actors.rollout.scoring import Captured
from asyncrl.actors.rollout.updates import POLICIES
from asyncrl.core.messages import WorkerCounters
from asyncrl.core.prompts import Prompt

OFFLINE_RUN_ID = "asyncrl-episode"
"""The run id of an offline loop's sample ids (asyncrl-episode-w<worker>-g<problem>-0): never a training sample's."""


class NoAdmission:
    """An offline loop's buffer: its groups are started all at once, nothing is asked for or put."""

    asking = False

    def ask(self, room: int, version: int) -> None:
        pass

    def granted(self, timeout_s: float = 0.0) -> None:
        return None

    def loaded(self, version: int) -> None:
        pass

    def put(self, records: list[dict]) -> None:
        raise RuntimeError("an offline run puts nothing")


def episodes(training: GenerationLoop, prompts: list[Prompt], greedy: bool) -> list[dict]:
    """One episode per prompt, in order, under `training`'s version; sampled at its temperature unless `greedy`."""
    mine = training.flight
    for p in prompts:  # every prompt is checked before any episode starts: a bad one raises, naming it
        mine.maker.eval_ids(p, mine.maker.opening(p))
    captured, link = Captured(), NoAdmission()
    flight = Flight(training.engine, mine.maker, captured, link.put, mine.tools, iter(prompts), WorkerCounters(), run_id=OFFLINE_RUN_ID,
                    worker_id=mine.worker_id, group_size=1, sampling=(0.0 if greedy else mine.temperature, mine.top_p))
    flight.version = training.version
    loop = GenerationLoop(flight, link, POLICIES["keep"], max_inflight=len(prompts))
    flight.start_groups(len(prompts), strict=True)
    while flight.groups:
        loop.one_pass()
    by_number = sorted(captured.groups, key=lambda g: g.gid.number)
    return [episode_fields(next(iter(g.samples.values())).driver) for g in by_number]
