"""The weight-sync protocol between the learner group and the rollout engines.

Every learner rank takes part in a sync (the weights are gathered from their FSDP2 shards bucket by bucket, a
collective); rank 0 sends each bucket as it is gathered.

The transport (`asyncrl.core.weights.make_sender` / `make_receiver`: a torch.distributed broadcast, or CUDA IPC
handles) carries each version; a version is published without waiting
for the engines to load it, and at most one is in flight: the next publish first collects the loads of the last.
After the load every engine fingerprints what it serves and `collect` compares it with the learner's fingerprints of
what it sent (`verify`; asyncrl.core.fingerprint). An engine that dies while loading is reported, not replaced: replacing it is the fleet's (asyncrl/orchestration/fleet.py) (with the rollout
pool), after which `connect` rebuilds the group around the new engine and `publish` sends the version again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import ray

from asyncrl.core.config import Config
from asyncrl.core.deadlines import LearnerLost, StageClock, hung_message
from asyncrl.core.fingerprint import WeightMismatch, first_mismatch
from asyncrl.core.messages import LoadReport, SentWeights
from asyncrl.core.weights import group_name, new_secret


@dataclass
class Settled:
    """The engines' loads of one version: the slowest receive-and-load, the engines that died doing it, the ones
    whose served weights are not the sent ones (`learner.verify_weights`), and the verification's count and cost."""
    load_s: float = 0.0
    dead: list[int] = field(default_factory=list)
    hung: list[tuple[int, str]] = field(default_factory=list)  # engines past the watchdog's deadline, and its report
    mismatched: list[WeightMismatch] = field(default_factory=list)
    verified: int = 0  # engines whose fingerprints were compared
    unverified: int = 0  # engines that could not fingerprint (SGLang, tensor parallelism)
    verify_learner_s: float = 0.0  # the learner's CPU seconds fingerprinting what it sent (while the buckets are on the wire)
    verify_engine_s: float = 0.0  # the slowest engine fingerprinting what it serves (its generation paused)

    @property
    def verify_s(self) -> float:
        return self.verify_learner_s + self.verify_engine_s

    def metrics(self) -> dict:
        checked = self.verified + self.unverified
        return {"load_s": self.load_s, "verify_s": self.verify_s, "verify_learner_s": self.verify_learner_s,
                "verify_engine_s": self.verify_engine_s,
                **({"verified": self.verified / checked, "mismatches": len(self.mismatched)} if checked else {})}


def verify(version: int, sent: dict | None, reports: dict[int, LoadReport], dtype: str, spent_s: float = 0.0) -> Settled:
    """Compare each engine's fingerprints with the learner's (`sent`, None when not verifying)."""
    out = Settled(load_s=max((r.seconds for r in reports.values()), default=0.0))
    if sent is None:
        return out
    out.verify_learner_s, out.verify_engine_s = spent_s, max((r.verify_s for r in reports.values()), default=0.0)
    for i, report in sorted(reports.items()):
        if report.fingerprint is None:
            out.unverified += 1
            continue
        out.verified += 1
        if (m := first_mismatch(sent, report.fingerprint, dtype)) is not None:
            out.mismatched.append(WeightMismatch(i, version, m))
    return out


class WeightSync:
    def __init__(self, learners: list, cfg: Config) -> None:
        self.learners = learners
        self.learner = learners[0]  # rank 0: it publishes
        self.bucket_bytes = cfg.learner.sync_bucket_bytes
        self.transport = cfg.learner.weight_transport
        self.engine_ranks = cfg.rollout.tensor_parallel_size  # every tensor-parallel rank of an engine joins the group
        self.in_flight: list | None = None  # each engine's load of the version last published
        self.sent: SentWeights | None = None  # what the learner sent of it (its fingerprints)
        self.version, self.dtype = 0, "float32"
        self.clock = StageClock(cfg.run.hang_factor, cfg.run.hang_floor_s, cfg.run.hang_first_s)  # the watchdog's
        self.published_at = 0.0
        self.stuck: list[tuple[int, str]] = []  # engines the last publish found frozen before they received it

    def connect(self, workers: list, host: str) -> None:
        """(Re)build the group of learner rank 0 and every engine, rendezvousing at `host`."""
        port = ray.get(self.learner.pick_port.remote(host))
        meta, transport = ray.get([self.learner.weight_meta.remote(), self.learner.transport.remote()])
        self.dtype = meta[0][1] if meta else "float32"  # what the engines are sent, so what they serve
        world, ranks = weight_group_ranks(len(workers), self.engine_ranks)
        name = group_name(new_secret())  # the store prefix: only the ranks, told through Ray, know it
        refs = [self.learner.init_weight_sync.remote(host, port, world, name)]
        refs += [w.init_weight_sync.remote(host, port, first, world, transport, meta, self.bucket_bytes, name) for w, first in zip(workers, ranks)]
        ray.get(refs)

    def publish(self, workers: list, version: int) -> dict:
        """Send the learner's weights to every engine as `version`; the loads stay in flight (`collect`).

        A broadcast streams the buckets as they are gathered, at most a few in flight: the engines' receives are
        posted before the send is waited on. CUDA IPC hands out the handles of the whole snapshot, so the engines
        are called once the learner has made it."""
        sends = [learner.send_weights.remote() for learner in self.learners]
        payload = _from_learner(sends[:1], "send_weights")[0].payload if self.transport == "cuda_ipc" else None
        self.in_flight = [w.update_weights.remote(version, payload) for w in workers]
        self.published_at = time.monotonic()
        self.sent, self.version, self.stuck = None, version, []
        done, _ = ray.wait(sends, num_returns=len(sends), timeout=self.clock.deadline("weight send"))
        broke = _from_learner(sends[:1], "send_weights")[0].error if sends[0] in done else None
        if len(done) < len(sends) or broke is not None:
            self.stuck = self._frozen(workers, broke)  # an engine that froze before it took the broadcast holds it up
            if self.stuck or broke:  # the others wait for buckets that will not come: they give up now
                frozen = {i for i, _ in self.stuck}
                told = [w.abandon_weights.remote() for i, w in enumerate(workers) if i not in frozen]
                ray.wait(told, num_returns=len(told), timeout=self.clock.floor_s)
            if self.stuck:
                return {"bytes": 0, "send_s": time.monotonic() - self.published_at}
        sent: SentWeights = _from_learner(sends, "send_weights")[0]
        if sent.error is None:
            self.clock.record("weight send", sent.seconds)
            self.sent = sent
        return {"bytes": sent.bytes, "send_s": sent.seconds}

    def _frozen(self, workers: list, broke: str | None) -> list[tuple[int, str]]:
        """The engines whose load is not done and that do not answer a stats call within `run.hang_floor_s`: their
        process is frozen (or wedged) and the learner's broadcast waited on them (past its deadline, or until it
        `broke`). The watchdog's report for each."""
        loading = [i for i, ref in enumerate(self.in_flight) if not ray.wait([ref], timeout=0)[0]]
        probes = {i: workers[i].stats.remote() for i in loading}
        ray.wait(list(probes.values()), num_returns=len(probes), timeout=self.clock.floor_s)
        waited = time.monotonic() - self.published_at
        silent = f"it did not answer a stats call in {self.clock.floor_s:g} s"
        report = (lambda i: f"rollout worker {i} did not receive version {self.version}: the learner's broadcast broke "
                            f"after {waited:.0f} s ({broke}) and {silent}") if broke else \
                 (lambda i: hung_message(f"rollout worker {i}", "update_weights", waited, self.clock, "weight send",
                                         f"version {self.version} not received: the learner's broadcast waited on it; {silent}"))
        return [(i, report(i)) for i, ref in probes.items() if not ray.wait([ref], timeout=0)[0]]

    def collect(self, skip: int | None = None) -> Settled:
        """Wait for the version in flight and verify it: the slowest engine's receive-and-load seconds, the engines
        that died doing it and the ones that serve other weights than were sent (`verify`).

        A peer dying breaks the broadcast for every receiver (gloo fails it on all ranks at once); the survivors
        keep their previous weights (nothing is loaded before the last bucket is in) and get the version again
        once the group is rebuilt, so their errors are expected then and only then (`skip`: the engine already
        known dead)."""
        if self.in_flight is None:
            return Settled()
        receivers, self.in_flight = self.in_flight, None
        dead, errors, reports, hung = [], [], {}, []
        deadline = self.published_at + self.clock.deadline("weight load")
        for i, ref in enumerate(receivers):
            try:
                reports[i] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:  # frozen, or stuck inside the load: the watchdog reports it
                if i != skip:
                    hung.append((i, hung_message(f"rollout worker {i}", "update_weights", time.monotonic() - self.published_at,
                                                 self.clock, "weight load", f"receiving and loading version {self.version}")))
            except ray.exceptions.RayActorError:  # died mid-update
                dead.append(i)
            except ray.exceptions.RayTaskError as exc:
                errors.append(exc)
        if reports:  # from the call's arrival to the load's end, waiting for the loop (a drain) included
            self.clock.record("weight load", max(r.wall_s for r in reports.values()))
        if errors and not dead and skip is None:
            raise errors[0]
        _from_learner([self.learner.weights_loaded.remote()], "weights_loaded")  # e.g. the IPC snapshot, loaded by every engine, may go
        sent = self.sent
        settled = verify(self.version, sent.fingerprint if sent else None, reports, self.dtype, sent.fingerprint_s if sent else 0.0)
        settled.dead = [i for i in dead if i != skip]
        settled.hung = hung
        settled.mismatched = [m for m in settled.mismatched if m.engine != skip]
        return settled


    def abandon(self) -> None:
        """The learner group was lost: the version in flight will not arrive (its sender is gone; each engine's
        receive fails and it keeps the weights it had). Wait for the engines to give up on it, up to the load's
        deadline, so that they take the next group's join."""
        refs, self.in_flight, self.sent = self.in_flight, None, None
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=self.clock.deadline("weight load"))


def _from_learner(refs: list, method: str) -> list:
    """The learner ranks' answers; a rank whose process died raises LearnerLost (the controller restores the group)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayActorError as exc:
        raise LearnerLost(f"a learner rank died during {method} ({type(exc).__name__})") from None


def weight_group_ranks(engines: int, tensor_parallel_size: int) -> tuple[int, list[int]]:
    """(world size of the weight group, each engine's first rank): learner rank 0, then `tensor_parallel_size` ranks
    per engine, one per tensor-parallel worker (each joins at its engine's first rank + its tensor-parallel rank)."""
    return 1 + engines * tensor_parallel_size, [1 + i * tensor_parallel_size for i in range(engines)]
