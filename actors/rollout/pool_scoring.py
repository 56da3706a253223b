"""The reward pool's side of the hand-off (actors/reward.py): a finished group goes to its prompt's reward actor."""
from __future__ import annotations

import ray

from asyncrl.actors.reward import RewardClient
from asyncrl.actors.rollout.state import Group
from asyncrl.core.prompts import Prompt


class PoolScoring:
    """asyncrl.actors.rollout.scoring.Scoring over a RewardClient: the pool scores and delivers, the loop goes on."""

    def __init__(self, client: RewardClient) -> None:
        self.client = client

    def hand_off(self, group: Group, records: list[dict]) -> None:
        self.client.hand_off(records, group.prompt)

    def check(self) -> None:
        self.client.check()

    def finish(self, timeout_s: float) -> list[dict]:
        return self.client.finish(timeout_s)

    def score_texts(self, prompts: list[Prompt], responses: list[str]) -> list[float]:
        if not responses:
            return []
        return ray.get(self.client.scorers[0].score_texts.remote(prompts, responses))

    def __len__(self) -> int:
        return len(self.client)
