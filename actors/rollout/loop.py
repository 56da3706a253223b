"""The generation loop: one pass applies pending weight updates, submits queued validations, starts admitted
groups, advances episodes (tool outcomes in, due turns submitted), steps the engine and collects what finished
(asyncrl.actors.rollout.flight). It imports no Ray: the buffer link, the engine, the reward hand-off and the tools
are handed in, so a test steps it with fakes."""
from __future__ import annotations

import threading
import time
from collections import deque

from asyncrl.actors.engine import Finished
from asyncrl.actors.rollout.evaluation import LiveEvals
from asyncrl.actors.rollout.flight import Flight
from asyncrl.actors.rollout.state import Update
from asyncrl.actors.rollout.updates import UpdatePolicy
from asyncrl.core.messages import LoadReport

TRACE_LIMIT = 200_000
"""Engine steps kept between two drains, the newest (a stalled controller must not grow the worker without bound)."""
IDLE_WAIT_S = 0.005
"""With nothing for the engine to run but groups held (being scored, tool calls running), how long the loop waits
before it looks again: a tool's outcome or a score waits at most this long to be taken."""
QUIET_WAIT_S = 0.5
"""With nothing held at all, the loop sleeps on `wake` for up to this long while its admission call is held by the
buffer: an answer, a weight update, a validation or a stop wakes it at once. A loop that woke every few
milliseconds here took a tenth of a core, which a learner sharing the cores (the synchronous recipes) paid for."""
SCORING_CHECK_S = 0.02
"""How often the loop takes what the reward hand-off brought back (the pool's: a `ray.wait` over every group in
scoring, so not every engine step)."""


class GenerationLoop:
    """`link`: the buffer (asyncrl.actors.rollout.buffer_link.BufferLink, or a fake): admission and hand-off;
    `policy`: what becomes of running requests at a weight update (asyncrl.actors.rollout.updates)."""

    def __init__(self, flight: Flight, link, policy: UpdatePolicy, *, max_inflight: int, keep_kv: bool = False, verify: bool = False,
                 wake: threading.Event | None = None) -> None:
        if policy.restarts_episodes and flight.maker.agent:
            raise ValueError(f"rollout.weight_update={policy.name} restarts episodes, which a black-box agent cannot do")
        self.flight, self.link, self.policy, self.max_inflight, self.keep_kv = flight, link, policy, max_inflight, keep_kv
        self.verify = verify  # fingerprint the weights served after each load (learner.verify_weights)
        self.engine, self.counters = flight.engine, flight.counters
        self.error: str | None = None
        self.updates: deque[Update] = deque()
        self.evals = LiveEvals()
        self.trace: deque[tuple[float, int]] = deque(maxlen=TRACE_LIMIT)  # (wall time, requests in the engine) per step
        self.next_admit = self.next_check = 0.0
        self.admitting = True  # false once the worker is being removed from the pool: it finishes what it holds
        self.wake = wake if wake is not None else threading.Event()  # set by whatever gives an idle loop work (`notify`; the link's answered admission)

    @property
    def version(self) -> int:
        return self.flight.version

    def run(self, stop: threading.Event) -> None:
        """Passes until `stop` or an error. `loop_s`: engine steps (`busy_s`), idle waits (`idle_s`), weight updates
        (`update_s`) and the rest, asyncrl's own work (admission, scoring, hand-off)."""
        started = time.monotonic()
        try:
            while not stop.is_set() and self.error is None:
                self.one_pass(stop)
        finally:
            self.counters.loop_s += time.monotonic() - started

    def notify(self) -> None:
        """Wake the loop from a quiet wait (`QUIET_WAIT_S`): a weight update, a validation or a stop is queued."""
        self.wake.set()

    def quiet(self) -> bool:
        """Nothing held that needs looking at: no group generating, in scoring or between turns, nothing queued."""
        return not (len(self.flight) or len(self.flight.scoring) or self.flight.waiting() or self.updates or not self.evals.jobs.empty())

    def one_pass(self, stop: threading.Event | None = None) -> None:
        self.wake.clear()  # what is set from here on is seen by this pass or ends its wait
        self.apply_queued()
        self.evals.submit_queued(self.engine, self.flight.maker.eval_ids, self.flight.params, self.flight.maker.limits.turn_tokens, self.version)
        self.admit()
        self.flight.advance()
        if time.monotonic() >= self.next_check:
            self.flight.scoring.check()
            self.next_check = time.monotonic() + SCORING_CHECK_S
        if self.engine.has_unfinished():
            self.step()
            return
        t0 = time.monotonic()
        if self.link.asking:
            self.link.wait(QUIET_WAIT_S if self.quiet() else IDLE_WAIT_S)
        elif stop is not None:
            stop.wait(IDLE_WAIT_S)
        else:
            time.sleep(IDLE_WAIT_S)
        self.counters.idle_s += time.monotonic() - t0

    def fail(self, message: str) -> None:
        """Report an error (it stops the run) and end the loop after the current pass."""
        if self.error is None:
            self.error = f"rollout worker {self.flight.worker_id}: {message}"

    def admit(self) -> None:
        """Start the groups of an answered admission call, and ask for more when there is room (at most one call in
        flight, never waited for: the engine steps meanwhile)."""
        admitted = self.link.granted()
        if admitted is not None:
            self.flight.start_groups(admitted)
            self.next_admit = time.monotonic() + (0.0 if admitted else 0.005)
        room = self.max_inflight - len(self.flight)
        if room > 0 and self.admitting and not self.link.asking and time.monotonic() >= self.next_admit:
            self.link.ask(room, self.version)

    def step(self) -> None:
        self.trace.append((time.time(), self.engine.num_unfinished()))
        t0 = time.monotonic()
        finished = self.evals.take(self.engine.step(), self.flight.maker.decode)
        self.counters.busy_s += time.monotonic() - t0
        self.flight.collect(finished)

    def abort(self, request_ids: list[str]) -> list[Finished]:
        """Abort these requests; returns the partial outputs. One the engine had finished before the abort reached
        it (SGLang runs between polls) is collected as finished, never resumed past its end."""
        outs = self.engine.abort(request_ids)
        self.flight.collect([out for out in outs if out.finish_reason != "abort"])
        return [out for out in outs if out.finish_reason == "abort"]

    # ---- weight updates ---------------------------------------------------------------

    def apply_queued(self) -> None:
        while self.updates:
            self.apply(self.updates.popleft())

    def apply(self, update: Update) -> None:
        """Apply a weight update or a (re)join of the weight group; an error goes to the caller of update_weights."""
        try:
            if update.init_args is not None:
                update.result = all(self.engine.init_weight_sync(*update.init_args))
            else:
                update.result = self.load(update.version, update.payload)
        except Exception as exc:
            update.error = f"weight update failed on worker {self.flight.worker_id}: {exc!r}"
        update.done.set()

    def load(self, version: int, payload=None) -> LoadReport:
        """Load `version` between two engine steps; what runs meanwhile is the policy's (rollout.weight_update)."""
        started = time.monotonic()
        if self.policy.drains:
            self.drain()
        with self.engine.paused():  # nothing generates from here until the new weights are in
            again = self.policy.before_load(self, list(self.flight.running()))
            t0 = time.monotonic()
            nbytes = self.engine.receive_weights(payload, keep_kv=self.keep_kv)
            loaded = time.monotonic()
            served = self.engine.fingerprint() if self.verify else None
            verify_s = time.monotonic() - loaded
            self.flight.version = version
            self.counters.weight_updates += 1
            self.link.loaded(version)
        for sample_id in again:
            self.flight.submit(self.flight.sample(sample_id))
        self.counters.resubmitted += len(again)
        self.counters.update_s += time.monotonic() - started
        return LoadReport(version=version, seconds=loaded - t0, bytes=nbytes, fingerprint=served, verify_s=verify_s)

    def drain(self) -> None:
        """Step until every running request has finished on the current weights (episodes: until every one in
        flight has ended, tool calls included); nothing is admitted meanwhile. `drain_s` adds up these steps."""
        while self.engine.has_unfinished() or self.flight.waiting():
            t0 = time.monotonic()
            self.flight.advance()
            if self.engine.has_unfinished():
                self.step()
            else:
                time.sleep(IDLE_WAIT_S)
            self.counters.drain_s += time.monotonic() - t0

    # ---- the end ------------------------------------------------------------------------

    def stop(self, granted: int, why: str, reason: str = "run stopped while its group was generating") -> list[dict]:
        """The loop has stopped: start the `granted` groups of the last admission, end the evaluations (`why`), abort
        what runs; returns the records of every group in flight, marked aborted_at_end with `reason` (what each
        sample had sampled kept)."""
        flight = self.flight
        flight.start_groups(granted)
        self.evals.end(self.engine, why)
        flight.keep_partial(self.abort(list(flight.running())))
        records = []
        for group in flight.groups.values():
            for state in group.samples.values():
                if not state.done:
                    kept = state.kept or Finished(state.sample_id, [], [], "abort")
                    state.driver.interrupted(kept.token_ids, kept.logprobs, state.versions[: len(kept.token_ids)])
                    state.ended = (self.version, None)
            records += flight.records(group)
        flight.groups.clear()
        for r in records:
            r.update(status="aborted_at_end", status_reason=reason)
        return records
