"""Algorithm plugins. Built-ins register here; users name their own module by dotted path."""
from algorithms import grpo
from algorithms.base import (
    LossInputs,
    LossOutput,
    get_algorithm,
    register_algorithm,
    registered_algorithms,
)

register_algorithm("grpo", grpo)

__all__ = ["LossInputs", "LossOutput", "get_algorithm", "register_algorithm", "registered_algorithms"]
