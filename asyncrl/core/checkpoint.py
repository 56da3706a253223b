"""Checkpoints of a run: RUN_DIR/checkpoints/step-NNNNNN/, written atomically, newest named in `latest`.

A checkpoint holds what continuing the run needs: the learner's state
(`learner.pt`: policy and critic weights, optimizers, counters, RNG) and the
controller's (`state.json`: next step, policy version, sample totals, each
rollout worker's data cursor, buffer accounting), and with `run.checkpoint_hf` the policy as a
Hugging Face model directory (`hf/`; `python -m asyncrl.export` makes one from a checkpoint without it). It is written into a
temporary directory and renamed into place, then `latest` is replaced (also by
rename): a crash at any point leaves the previous checkpoint whole and named.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

STATE = "state.json"
LATEST = "latest"
CHECKPOINT_HF_DIR = "hf"
"""The policy as a Hugging Face model directory inside a checkpoint (run.checkpoint_hf)."""


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def write_checkpoint(run_dir: Path, step: int, state: dict, write_files: Callable[[Path], None], keep: int) -> Path:
    """Create step-NNNNNN atomically: `write_files(tmp_dir)` then `state` as state.json; prune to `keep`."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write_files(tmp)
    (tmp / STATE).write_text(json.dumps(state, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / LATEST)
    for old in sorted(p for p in root.glob("step-*") if p != final)[: max(0, len(list(root.glob("step-*"))) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names (or the newest complete one if the pointer is missing); None if there is none."""
    root = checkpoints_dir(run_dir)
    named = root / LATEST
    if named.is_file():
        path = root / named.read_text().strip()
        if (path / STATE).is_file():
            return path
    complete = list(complete_checkpoints(run_dir).values())
    return complete[-1] if complete else None


def complete_checkpoints(run_dir: Path) -> dict[int, Path]:
    """Every complete checkpoint of the run (its state.json written), by the step it continues at, in order."""
    found = {int(p.name.removeprefix("step-")): p for p in checkpoints_dir(run_dir).glob("step-*") if (p / STATE).is_file()}
    return dict(sorted(found.items()))


def read_state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / STATE).read_text())


def truncate_metrics(path: Path, next_step: int) -> int:
    """Keep metrics rows of steps before `next_step` (a resume redoes the rest); atomic. Returns rows kept."""
    if not path.is_file():
        return 0
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a torn last line of a killed run
            continue
        if row.get("step", -1) < next_step:
            kept.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return len(kept)
