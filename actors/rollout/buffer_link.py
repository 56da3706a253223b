"""The loop's calls to the replay buffer actor (actors/buffer.py), the only Ray the loop sees, through this object."""
from __future__ import annotations

import threading

import ray

ADMIT_WAIT_S = 1.0
"""Longest the buffer holds an admission call that it cannot grant yet (it answers as soon as it can): one call a
second while the worker waits, instead of one every few milliseconds."""

MAX_UNACKED_PUTS = 64
"""Puts in flight before the loop waits for them."""


class BufferLink:
    """At most one admission call in flight (`ask`, answered by `granted`): the engine steps meanwhile. `put`
    hands a group over without waiting; `loaded` tells the buffer which version this worker now holds (an
    admission waiting for it may go on). `wake`: the generation loop's (`GenerationLoop.wake`), set when an admission
    call is answered, so the loop's `wait` sleeps on it and is woken by that answer as by a weight update."""

    def __init__(self, buffer, worker_id: int, wake: threading.Event) -> None:
        self.buffer, self.worker_id, self.wake = buffer, worker_id, wake
        self.admission = None
        self.pending_puts: list = []

    @property
    def asking(self) -> bool:
        return self.admission is not None

    def ask(self, room: int, version: int) -> None:
        self.admission = self.buffer.admit.remote(room, self.worker_id, version, ADMIT_WAIT_S)
        wake = self.wake
        self.admission.future().add_done_callback(lambda _answered: wake.set())

    def granted(self, timeout_s: float = 0.0) -> int | None:
        """The groups the call in flight granted, once it is answered (None before, or with no call)."""
        if self.admission is None or not ray.wait([self.admission], timeout=timeout_s)[0]:
            return None
        admitted, self.admission = ray.get(self.admission), None
        return admitted

    def wait(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the admission call to be answered, or for anything else to wake the loop (`wake`)."""
        self.wake.wait(timeout_s)

    def loaded(self, version: int) -> None:
        self.buffer.loaded.remote(self.worker_id, version)

    def put(self, records: list[dict]) -> None:
        self.pending_puts.append(self.buffer.put.remote(records))
        if len(self.pending_puts) > MAX_UNACKED_PUTS:
            self.flush()

    def flush(self) -> None:
        ray.get(self.pending_puts)
        self.pending_puts = []

    def release(self) -> int:
        """At stop: answer the admission call still waiting (0 at once); returns the groups it had granted, which the
        loop starts and records as aborted with the rest."""
        if self.admission is None:
            return 0
        self.buffer.release.remote(self.worker_id)
        admitted, self.admission = ray.get(self.admission), None
        return admitted

    def record_final(self, records: list[dict]) -> None:
        ray.get(self.pending_puts + [self.buffer.record_final.remote(records)])
        self.pending_puts = []
