"""The rollout loop's link to a real replay buffer actor: an admission call the buffer holds wakes the loop when it is
answered (the loop sleeps on that instead of polling)."""
import threading
import time

from asyncrl.actors import buffer as buffer_module
from asyncrl.actors.rollout import buffer_link
from asyncrl.core.config import load_config

HOLD_S = 20.0  # the buffer's hold of an admission call it cannot grant: longer than any wait below


def test_a_held_admission_wakes_the_loop_when_the_buffer_answers_it(ray_local, tmp_path, monkeypatch):
    monkeypatch.setattr(buffer_link, "ADMIT_WAIT_S", HOLD_S)
    cfg = load_config(None, ["rollout.group_size=2", "learner.batch_size=4", "buffer.max_staleness=0"])
    buffer = ray_local.remote(buffer_module.ReplayBuffer).remote(cfg, str(tmp_path / "traj"))
    wake = threading.Event()
    link = buffer_link.BufferLink(buffer, 0, wake)
    link.ask(2, 0)
    assert wake.wait(30) and link.granted(5) == 2  # room at version 0: answered at once, and that woke the loop
    wake.clear()
    t0 = time.monotonic()
    link.ask(2, 0)  # the step's groups are out: held until a version is published and this worker has loaded it
    link.wait(0.3)
    assert not wake.is_set() and link.asking and link.granted() is None
    ray_local.get([buffer.set_version.remote(1), buffer.loaded.remote(0, 1)])
    link.wait(HOLD_S * 2)
    assert wake.is_set() and time.monotonic() - t0 < HOLD_S / 2  # woken by the answer, long before the hold ends
    assert link.granted(5) == 2
