"""A user environment: arithmetic word problems with a second chance.

A wrong answer is answered "That is not right. Try again." and the model may answer again, up to
env.max_turns turns; the reward is 1 for a correct answer at the first turn and 0.5 at a later one.
It brings its own task records (`record`), so it names itself as the task too. Run it with

    PYTHONPATH=examples python -m asyncrl.run --config configs/smollm2_guess_number.yaml \
        env.name=my_envs.retry.RetryEnv task.name=my_envs.retry.RetryEnv
"""
from __future__ import annotations

import random

from asyncrl.core.envs import Environment, EnvStep
from asyncrl.core.rewards import final_number
from asyncrl.core.tasks import ANSWER_FORMAT, word_problem


class RetryEnv(Environment):
    name = "retry_word_problems"

    def __init__(self, prompt, seed):
        super().__init__(prompt, seed)
        self.tries = 0

    @classmethod
    def record(cls, rng: random.Random, task) -> tuple[str, str]:
        text, answer = word_problem(rng, rng.randint(1, task.steps))
        return text + ANSWER_FORMAT, str(answer)

    def step(self, text: str) -> EnvStep:
        self.tries += 1
        if final_number(text) == self.prompt.answer:
            return EnvStep(done=True, reward=1.0 if self.tries == 1 else 0.5, reason=f"correct at try {self.tries}")
        return EnvStep(observation="That is not right. Try again.")
