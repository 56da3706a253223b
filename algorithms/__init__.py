"""Algorithm plugins. Built-ins register here; users name their own module by dotted path."""
from algorithms import grpo, reinforce_pp, rloo
from algorithms.base import (
    LossInputs,
    LossOutput,
    get_algorithm,
    register_algorithm,
    registered_algorithms,
)

register_algorithm("grpo", grpo)
register_algorithm("rloo", rloo)
register_algorithm("reinforce_pp", reinforce_pp)

__all__ = ["LossInputs", "LossOutput", "get_algorithm", "register_algorithm", "registered_algorithms"]
