"""RunControl: a running job's mailbox, a named Ray actor that `asyncrl scale` finds on the cluster.

`asyncrl scale RUN N` leaves a rollout pool size here (checked against the bounds at once, so a bad request is
refused to the person who made it); `asyncrl stop RUN` asks the run to make its current step the last. The
controller takes both at its next step and reports the pool's state back, which `asyncrl scale RUN` prints.
Nothing here touches a worker.
"""
from __future__ import annotations

from asyncrl.core.elastic import Bounds, target_error

NAMESPACE = "asyncrl"
CONTROL_FILE = "control.json"
"""In the run directory: {"name": the control actor's name, "ray_address": the cluster's GCS address}."""


def control_name(run_name: str) -> str:
    """The Ray actor name of the run whose directory is called `run_name`."""
    return f"asyncrl-run-{run_name}"


class RunControl:
    def __init__(self, run_name: str, bounds: Bounds) -> None:
        self.run_name, self.bounds = run_name, bounds
        self.pending: int | None = None
        self.stop_asked = False
        self.pool: dict = {}  # the controller's last report

    def request(self, workers: int) -> str:
        """Ask for `workers` rollout workers; a ValueError naming the bound when it is outside them."""
        if (why := target_error(workers, self.bounds)) is not None:
            raise ValueError(f"run {self.run_name}: {why}")
        self.pending = workers
        serving = self.pool.get("serving", "?")
        return f"run {self.run_name}: asked for {workers} rollout workers (serving {serving}); the run acts on it at its next step"

    def take(self) -> int | None:
        """The size last asked for, once (None: nothing new)."""
        pending, self.pending = self.pending, None
        return pending

    def stopping(self) -> bool:
        return self.stop_asked

    def stop(self) -> str:
        """Ask the run to end after the step under way, as at its last step (weights published, checkpoint, final
        evaluation, summary with stopped_by "command")."""
        self.stop_asked = True
        return f"run {self.run_name}: asked to stop after the step under way (at step {self.pool.get('step', '?')})"

    def report(self, pool: dict) -> None:
        self.pool = pool

    def state(self) -> dict:
        return {"run": self.run_name, **self.pool, "asked": self.pending, "stop_asked": self.stop_asked}
