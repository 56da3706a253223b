"""Algorithm plugins. Built-ins register here; users name their own module by dotted path."""
from asyncrl.algorithms import grpo, ppo, reinforce_pp, rloo
from asyncrl.algorithms.base import (
    AdvantageInputs,
    Advantages,
    LossInputs,
    LossOutput,
    get_algorithm,
    register_algorithm,
    registered_algorithms,
)

register_algorithm("grpo", grpo)
register_algorithm("ppo", ppo)
register_algorithm("rloo", rloo)
register_algorithm("reinforce_pp", reinforce_pp)

__all__ = ["AdvantageInputs", "Advantages", "LossInputs", "LossOutput", "get_algorithm", "register_algorithm", "registered_algorithms"]
