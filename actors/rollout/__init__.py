"""The rollout side: a Ray-facing worker (worker.py) around a generation loop that imports no Ray (loop.py).

    worker.py        RolloutWorker, the Ray actor: lifecycle, stats, the update queue, the offline API
    loop.py          GenerationLoop: apply updates -> admit -> advance episodes -> step the engine -> collect
    state.py         per group and per sample state (Group, SampleState) and the Update request
    episodes.py      EpisodeMaker: encodes prompts and makes each sample's episode driver (asyncrl.core.episode)
    updates.py       one policy per rollout.weight_update mode: keep, abort, drain, resume
    scoring.py       the reward hand-off: in the loop, the environment's own reward (pool_scoring.py: the pool)
    records.py       a sample's record when it ends, is dropped, or the run stops
    evaluation.py    validation generated next to the training requests (evaluate_live)
    offline.py       episodes played outside training through a loop of their own (evaluation, tests)
    buffer_link.py   the loop's calls to the replay buffer actor

docs/rollout.md draws the data flow."""
from __future__ import annotations


def __getattr__(name: str):
    if name == "RolloutWorker":  # imported on use: the loop's modules (and their tests) need no Ray
        from asyncrl.actors.rollout.worker import RolloutWorker

        return RolloutWorker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RolloutWorker"]
