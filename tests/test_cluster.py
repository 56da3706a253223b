"""Which Ray cluster `python -m asyncrl.run` uses, and what it says when a dead head left its address behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from asyncrl.orchestration.cluster import choose_cluster, unreachable
from asyncrl.core.weights import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_choose_cluster():
    f = "/tmp/ray/ray_current_cluster"
    assert choose_cluster("10.0.0.1:6379", "", f, "") == ("10.0.0.1:6379", "")  # given: used as it is
    assert choose_cluster("local", "127.0.0.1:6379", f, "") == ("", "")  # "local": always a new one
    assert choose_cluster("", "", f, "") == ("", "")  # nothing recorded: a new local cluster
    address, message = choose_cluster("", "127.0.0.1:6379", f, "")
    assert address == "127.0.0.1:6379" and "joining the Ray cluster at 127.0.0.1:6379" in message
    address, message = choose_cluster("", "127.0.0.1:6379", f, "nothing answers at 127.0.0.1:6379 (refused)")
    assert address == "" and f in message and "without `ray stop`" in message and "Starting a local cluster" in message


def test_unreachable_names_the_port():
    port = free_port()
    assert f"nothing answers at 127.0.0.1:{port}" in unreachable(f"127.0.0.1:{port}", timeout_s=2)
    assert unreachable("auto") == ""


@pytest.mark.slow
def test_a_stale_address_file_is_named_and_a_local_cluster_started(tmp_path):
    """Also the training time budget, in the same short run: a budget spent by the first step ends the run there."""
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # Ray's AF_UNIX socket paths must stay short
    dead = f"127.0.0.1:{free_port()}"
    os.makedirs(f"{ray_tmp}/ray")
    Path(f"{ray_tmp}/ray/ray_current_cluster").write_text(dead + "\n")  # what a head killed without `ray stop` leaves
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={tmp_path}/r", "run.steps=5", "run.eval=false",
         "run.max_train_minutes=0.0001", "run.checkpoint_every=3"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"names a Ray cluster at {dead}, but nothing answers" in proc.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped_by"] == "time" and summary["policy_version"] == 1  # its weights published
    assert [p.name for p in (tmp_path / "r" / "checkpoints").glob("step-*")] == ["step-000001"]  # and checkpointed as the last
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count("\n") == 1
