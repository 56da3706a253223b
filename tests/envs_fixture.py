"""Environments for the tests: they play the same script whatever the model writes, so that an untrained model
exercises every part of an episode (a tool call, an observation, a reply, the end). A user's environment found by
dotted path, as `env.name=tests.envs_fixture.ScriptedEnv`."""
from __future__ import annotations

import os
import time

from asyncrl.core.envs import CalculatorEnv, Environment, EnvStep, ToolCall


def reverse_digits(argument: str) -> str:
    """A tool: the argument's digits, reversed."""
    return "".join(c for c in argument if c.isdigit())[::-1] or "0"


def hang(argument: str) -> str:
    """A tool that never returns (its process is killed at env.tool_timeout_s)."""
    time.sleep(3600)
    return ""


def slow_reverse(argument: str) -> str:
    """A tool that takes 50-200 ms (the argument's digits pick the time), then answers as reverse_digits."""
    time.sleep(0.05 + (sum(map(ord, argument)) % 16) / 100)
    return reverse_digits(argument)


def die(argument: str) -> str:
    os._exit(3)


class ScriptedEnv(Environment):
    """Turn 1: calls the tool with argument "12" (whatever the model wrote); turn 2: is answered "34"; turn 3 ends the
    episode, rewarded 1 when the model's last turn has an even number of characters. Observations are digits only
    (the tiny model's vocabulary)."""

    name = "scripted"
    tools = {"tool": reverse_digits}

    def __init__(self, prompt, seed):
        super().__init__(prompt, seed)
        self.turn = 0

    def tool_call(self, text: str) -> ToolCall | None:
        self.turn += 1
        return ToolCall("tool", "12") if self.turn == 1 else None

    def tool_result(self, call: ToolCall, result: str) -> EnvStep:
        return EnvStep(observation=result)

    def step(self, text: str) -> EnvStep:
        if self.turn >= 3:
            return EnvStep(done=True, reward=float(len(text) % 2 == 0), reason="scripted end")
        return EnvStep(observation="34")


class HangingEnv(ScriptedEnv):
    tools = {"tool": hang}


class DyingEnv(ScriptedEnv):
    tools = {"tool": die}


class SlowToolEnv(ScriptedEnv):
    tools = {"tool": slow_reverse}


def sometimes_hang(argument: str) -> str:
    """Hangs (until killed) on the argument "hang", else answers as reverse_digits."""
    if argument == "hang":
        time.sleep(3600)
    return reverse_digits(argument)


class SometimesHangingEnv(ScriptedEnv):
    """ScriptedEnv whose tool call hangs in about one episode in six (the episode's seed decides)."""

    tools = {"tool": sometimes_hang}

    def tool_call(self, text: str) -> ToolCall | None:
        call = super().tool_call(text)
        return ToolCall("tool", "hang") if call is not None and self.rng.random() < 1 / 6 else call


def slow_calculator(expression: str) -> str:
    """The calculator tool, taking 50-200 ms a call (bench/agentic.py)."""
    from asyncrl.core.envs import calculator

    time.sleep(0.05 + (sum(map(ord, expression)) % 16) / 100)
    return calculator(expression)


class SlowCalculatorEnv(CalculatorEnv):
    tools = {"calc": slow_calculator}


class StoppingEnv(ScriptedEnv):
    """ScriptedEnv whose model turns end at the stop string "3" (a digit the untrained tiny model writes often)."""

    name = "stopping"
    stop = ("3",)
