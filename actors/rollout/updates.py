"""What becomes of the requests still generating when new weights arrive (`rollout.weight_update`): one policy per
mode, applied by the loop between two engine steps with the engine paused (GenerationLoop.load).

- keep: they go on under the new weights, so a sample may span versions (`policy_version_start` <
  `policy_version_end`); with `rollout.keep_kv` their KV computed under the old weights is kept.
- abort: they are aborted and resubmitted from the prompt under the new version (same sample id), so every token
  of a sample comes from one version; an unfinished episode restarts from its first turn with a fresh
  environment of the same seed. `resubmitted` counts them.
- drain: the loop admits nothing new and steps until they have finished on the old weights (episodes: until every
  one in flight has ended), then loads; `drain_s` counts the wait.
- resume (AReaL's partial rollouts): they are aborted, the tokens they had sampled are kept with their log-probs,
  and after the load each is resubmitted as prompt + those tokens with the budget left, so the new version writes
  only what follows (`resumed_tokens`). It needs only abort and add from an engine, where keep needs in-place
  re-prefill.
"""
from __future__ import annotations

from typing import Protocol

from asyncrl.actors.engine import Finished
from asyncrl.actors.rollout.flight import Flight
from asyncrl.core.messages import WorkerCounters


class Loop(Protocol):
    """What a policy uses of the generation loop (asyncrl.actors.rollout.loop.GenerationLoop)."""

    engine: object
    counters: WorkerCounters
    flight: Flight

    def abort(self, request_ids: list[str]) -> list[Finished]: ...


class UpdatePolicy:
    """One `rollout.weight_update` mode."""

    name = ""
    drains = False
    """The loop steps until nothing runs (and admits nothing) before it loads."""
    restarts_episodes = False
    """Unfinished episodes start again from their first turn: a black-box agent's cannot (it holds its own state)."""

    def before_load(self, loop: Loop, running: list[str]) -> list[str]:
        """With the engine paused, before the load; `running`: the samples with a request in the engine. Returns
        the samples to submit again after the load."""
        raise NotImplementedError


class Keep(UpdatePolicy):
    name = "keep"

    def before_load(self, loop: Loop, running: list[str]) -> list[str]:
        for sample_id in running:  # they go on; what they sampled so far is the old version's
            loop.flight.note_versions(sample_id, loop.engine.generated(sample_id))
        return []


class Drain(UpdatePolicy):
    name = "drain"
    drains = True

    def before_load(self, loop: Loop, running: list[str]) -> list[str]:
        return []  # nothing runs any more


class Abort(UpdatePolicy):
    name = "abort"
    restarts_episodes = True

    def before_load(self, loop: Loop, running: list[str]) -> list[str]:
        aborted = [out.request_id for out in loop.abort(running)]
        for sample_id in aborted:  # their tokens are thrown away
            loop.flight.sample(sample_id).versions = []
        return sorted(set(aborted) | loop.flight.restart_episodes())


class Resume(UpdatePolicy):
    name = "resume"

    def before_load(self, loop: Loop, running: list[str]) -> list[str]:
        partial = loop.abort(running)
        loop.flight.keep_partial(partial)
        loop.counters.resumed_tokens += sum(len(out.token_ids) for out in partial)
        return [out.request_id for out in partial]


POLICIES: dict[str, UpdatePolicy] = {p.name: p for p in (Keep(), Abort(), Drain(), Resume())}
