"""The tool processes (asyncrl.core.tools.ToolPool): calls run off the caller's loop, a hung tool is killed at its
timeout with nothing left running, a tool that ends its process is answered with the reason, and the pool goes on."""
from __future__ import annotations

import time

import pytest

from asyncrl.core.tools import ToolPool
from tests.test_scoring import alive


def wait_for(pool: ToolPool, n: int, limit_s: float = 60.0) -> list:
    outcomes, deadline = [], time.monotonic() + limit_s
    while len(outcomes) < n and time.monotonic() < deadline:
        outcomes += pool.poll()
        time.sleep(0.01)
    return outcomes


def test_calls_run_in_other_processes_and_poll_never_blocks():
    pool = ToolPool("tests.envs_fixture.SlowToolEnv", size=2, timeout_s=10)
    try:
        wait_for(pool, 0)
        for i in range(4):
            pool.submit(i, "tool", f"{i}12")
        slowest_poll = 0.0
        outcomes, deadline = [], time.monotonic() + 60
        while len(outcomes) < 4 and time.monotonic() < deadline:
            t0 = time.monotonic()
            outcomes += pool.poll()
            slowest_poll = max(slowest_poll, time.monotonic() - t0)
            time.sleep(0.005)
        assert sorted((o.key, o.result) for o in outcomes) == [(0, "210"), (1, "211"), (2, "212"), (3, "213")]
        assert all(o.error is None and 0.05 <= o.seconds < 5 for o in outcomes)
        assert slowest_poll < 0.05, "poll waited for a tool"  # each call sleeps 50-200 ms
        assert pool.pending() == 0 and pool.calls == 4
    finally:
        pool.close()


def test_a_hung_tool_is_killed_at_its_timeout_and_its_process_replaced():
    pool = ToolPool("tests.envs_fixture.HangingEnv", size=1, timeout_s=1.0)
    try:
        wait_for(pool, 0, limit_s=1)
        pool.submit("a", "tool", "1")
        deadline = time.monotonic() + 30
        while not pool.slots[0].call and time.monotonic() < deadline:  # started once the process is ready
            pool.poll()
            time.sleep(0.01)
        hung_pid = pool.pids()[0]
        t0 = time.monotonic()
        (outcome,) = wait_for(pool, 1)
        assert outcome.key == "a" and outcome.result is None
        assert "timed out after 1 s" in outcome.error and "killed" in outcome.error
        assert 0.9 <= time.monotonic() - t0 < 5 and pool.timeouts == 1
        assert not alive(hung_pid), "the hung tool's process is still running"
        assert pool.pids() and pool.pids()[0] != hung_pid  # a fresh process took its place
    finally:
        pids = pool.pids()
        pool.close()
        assert not any(alive(p) for p in pids)


def test_a_tool_that_ends_its_process_is_answered_with_the_reason():
    pool = ToolPool("tests.envs_fixture.DyingEnv", size=1, timeout_s=10)
    try:
        pool.submit("x", "tool", "1")
        (outcome,) = wait_for(pool, 1)
        assert outcome.error == "tool 'tool' ended its process (exit code 3)" and pool.crashes == 1
    finally:
        pool.close()


def test_an_environment_that_cannot_load_is_an_error_naming_it():
    pool = ToolPool("no_such_pkg.Env", size=1, timeout_s=10)
    try:
        with pytest.raises(RuntimeError, match="'no_such_pkg.Env' could not be loaded"):
            wait_for(pool, 1, limit_s=30)
    finally:
        pool.close()
