"""Rewards for the reward-pool tests, importable by dotted path in a scoring child process (tests.reward_fns.NAME)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from asyncrl.core.reward_traits import reward
from asyncrl.core.rewards import exact_match


def length(prompt, response: str) -> float:
    return float(len(response))


def hang_on_x(prompt, response: str) -> float:
    """Sleeps forever on a response "x", else its length."""
    if response == "x":
        time.sleep(3600)
    return float(len(response))


def die_on_x(prompt, response: str) -> float:
    """Kills its own process on a response "x" (no exception, no reply), else its length."""
    if response == "x":
        os._exit(7)
    return float(len(response))


def raise_on_x(prompt, response: str) -> float:
    if response == "x":
        raise ValueError("no x")
    return float(len(response))


def spawn_and_hang(prompt, response: str) -> float:
    """Starts a grandchild that would outlive it, writes the grandchild's pid to the response's path, then hangs."""
    if response == "warm":
        return 0.0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(response, "w") as f:
        f.write(str(child.pid))
    time.sleep(3600)
    return 0.0


@reward(batched=True)
def batch_sizes(prompts, responses) -> list[float]:
    """Each sample's reward is the size of the batch it came in."""
    return [float(len(prompts))] * len(prompts)


@reward(batched=True)
def sleepy_batched(prompts, responses) -> list[float]:
    """100 ms per call, whatever the batch: a slow checker, a judge, a sandbox."""
    time.sleep(0.1)
    return [exact_match(p, r) for p, r in zip(prompts, responses)]


@reward(batched=True)
def wrong_count(prompts, responses) -> list[float]:
    return [1.0]


@reward(deterministic=False)
def noisy(prompt, response: str) -> float:
    return float(len(response))


def counted_exact_match(prompt, response: str) -> float:
    """exact_match, appending one line per call to $ASYNCRL_TEST_CALLS (set by the test before the child starts)."""
    path = os.environ.get("ASYNCRL_TEST_CALLS")
    if path:
        with open(path, "a") as f:
            f.write(response + "\n")
    return exact_match(prompt, response)


def faulty_exact_match(prompt, response: str) -> float:
    """exact_match, except that it hangs on prompts whose sum is a multiple of 7 and kills its process on multiples
    of 11 (not of 7): the end-to-end test of the pool's timeouts on the addition task."""
    total = int(prompt.answer)
    if total % 7 == 0:
        time.sleep(3600)
    if total % 11 == 0:
        os._exit(3)
    return exact_match(prompt, response)
