"""A sample's record (asyncrl.core.schema), built from its episode when it ends, is dropped, or the run stops."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

from asyncrl.actors.rollout.state import Group, SampleState
from asyncrl.core.schema import Status, new_sample


def sample_record(run_id: str, worker_id: int, group: Group, state: SampleState, decode: Callable[[list[int]], str]) -> dict:
    """An ended sample's record, not yet scored. Its start version is its oldest token's (the request's start
    when it sampled nothing); its end the version of its last sampled token (SGLang may have finished it by itself
    before an update the worker saw first), or the version when it ended, for an interrupted one."""
    driver, (version_end, t_gen) = state.driver, state.ended
    ep = driver.episode
    sampled = ep.sampled_versions()
    if sampled and driver.finish_reason != "abort":
        version_end = sampled[-1]
    turns = {}
    if driver.multi_turn:  # the response holds observations too (loss mask 0, version -1)
        turns = {"loss_mask": ep.loss_mask, "turns": [dataclasses.asdict(t) for t in ep.turns],
                 "episode_end": driver.end.reason if driver.end else None}
    return new_sample(
        **turns, run_id=run_id, sample_id=state.sample_id, group_id=group.group_id, prompt_id=group.prompt.prompt_id,
        worker_id=worker_id, prompt_text=group.prompt.text, prompt_ids=ep.prompt_ids, response_ids=ep.response_ids,
        response_text=decode(ep.response_ids), behavior_logprobs=ep.behavior_logprobs, finish_reason=driver.finish_reason,
        policy_version_start=sampled[0] if sampled else state.start, policy_version_end=version_end,
        token_versions=ep.token_versions, t_submitted=group.t_submitted, t_generated=t_gen,
    )


def episode_fields(driver) -> dict:
    """An episode's tokens and outcome, as the offline API returns them (RolloutWorker.episodes)."""
    ep = driver.episode
    return {
        "prompt_ids": ep.prompt_ids, "response_ids": ep.response_ids, "loss_mask": ep.loss_mask,
        "behavior_logprobs": ep.behavior_logprobs, "token_versions": ep.token_versions,
        "turns": [dataclasses.asdict(t) for t in ep.turns], "reward": driver.end.reward if driver.end else None,
        "finish_reason": driver.finish_reason, "episode_end": driver.end.reason if driver.end else None,
    }


def dropped(records: list[dict], reason: str, status: Status = Status.DROPPED_ERROR) -> list[dict]:
    """`records` marked with `status` and `reason` (a record with its own reason keeps it)."""
    for r in records:
        r.update(status=status.value, status_reason=r.get("status_reason") or reason)
    return records


def bad_prompt_records(run_id: str, worker_id: int, group: Group, size: int, version: int, reason: str) -> list[dict]:
    """A group whose prompt the engine cannot take: `size` samples that never generated, dropped_error with `reason`."""
    return [new_sample(run_id=run_id, sample_id=group.gid.sample_id(i), group_id=group.group_id, prompt_id=group.prompt.prompt_id,
                       worker_id=worker_id, prompt_text=group.prompt.text, prompt_ids=[], response_ids=[], response_text="",
                       behavior_logprobs=[], finish_reason=None, policy_version_start=version, policy_version_end=version,
                       token_versions=[], t_submitted=group.t_submitted, t_generated=None, status=Status.DROPPED_ERROR.value,
                       status_reason=reason, t_scored=time.time())
            for i in range(size)]
