"""Talk to a running job: ``asyncrl scale RUN [N]`` resizes its rollout pool, ``asyncrl stop RUN`` ends it cleanly.

RUN is the run's directory (run.output_dir) or its name (the directory's last part). `scale RUN N` asks the run
for N rollout workers: it starts new ones (each joins the weight group at the next weight version) or retires the
last ones (each finishes the groups it holds first); `scale RUN` prints the pool's state. `stop RUN` makes the
step under way the last, as if it were run.steps' last (weights published, checkpoint, final evaluation, summary
with stopped_by "command"). The running job is found on its Ray cluster: the address the run wrote into
RUN/control.json when RUN is its directory here, else --address, RAY_ADDRESS, or the cluster `ray start` recorded
on this machine. Exit status 2, with one line on stderr, when no such run is going or the size is outside
rollout.min_workers / rollout.max_workers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path


def find(run: str, address: str | None) -> tuple[str, str]:
    """(control actor name, Ray address) of `run`, a run directory or a run name."""
    from asyncrl.actors.control import CONTROL_FILE, control_name

    path = Path(run)
    record = path / CONTROL_FILE
    if record.is_file():
        written = json.loads(record.read_text())
        if written.get("auth_mode") and not address:  # Ray turns token auth on by itself only for address="auto"
            os.environ.setdefault("RAY_AUTH_MODE", written["auth_mode"])
        return written["name"], address or written["ray_address"]
    name = path.resolve().name if path.is_dir() else path.name
    return control_name(name), address or os.environ.get("RAY_ADDRESS") or "auto"


def on_run(prog: str, run: str, address: str | None, call: Callable) -> int:
    """Call `call(control actor)` on the running job `run` and print what it returns; 2 and a line on stderr
    when the job is not found or refuses."""
    name, address = find(run, address)  # first: it may set RAY_AUTH_MODE, which Ray reads when imported
    import ray

    from asyncrl.actors.control import NAMESPACE

    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        print(f"{prog}: no Ray cluster at {address!r} for run {run!r}: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            control = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            print(f"{prog}: no running asyncrl job {run!r} on the Ray cluster at {address} (no actor {name!r}: "
                  "finished, not started yet, or on another cluster: --address)", file=sys.stderr)
            return 2
        try:
            answer = ray.get(call(control))
        except ray.exceptions.RayTaskError as exc:
            print(f"{prog}: {exc.cause}", file=sys.stderr)
            return 2
        print(answer if isinstance(answer, str) else json.dumps(answer))
        return 0
    finally:
        ray.shutdown()


def parser(prog: str, what: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=what)
    p.add_argument("run", metavar="RUN", help="the run's directory (run.output_dir) or its name")
    p.add_argument("--address", help="the Ray cluster's address (default: from RUN/control.json, RAY_ADDRESS, or `ray start`'s record)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser("asyncrl scale", "Resize a running job's rollout pool (none: print the pool's state).")
    p.add_argument("workers", metavar="N", type=int, nargs="?", help="rollout workers to run")
    args = p.parse_args(argv)
    if args.workers is None:
        return on_run(p.prog, args.run, args.address, lambda c: c.state.remote())
    return on_run(p.prog, args.run, args.address, lambda c: c.request.remote(args.workers))


def stop_main(argv: list[str] | None = None) -> int:
    p = parser("asyncrl stop", "End a running job after the step under way, as at its last step.")
    args = p.parse_args(argv)
    return on_run(p.prog, args.run, args.address, lambda c: c.stop.remote())


if __name__ == "__main__":
    sys.exit(main())
