"""`ray job submit --working-dir . -- python -m asyncrl.run ...` against a head started with `ray start --head`."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from asyncrl.core.models.cache import manifest
from asyncrl.core.weights import free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster]


def ray_cli(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    ray_bin = str(Path(sys.executable).with_name("ray"))
    return subprocess.run([ray_bin, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def cluster_env() -> dict:
    # Ray >= 2.59 turns on token auth for local clusters: give every node and the client the same token
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    env.pop("RAY_ADDRESS", None)
    return env


def start_node(env: dict, temp_dir: str, resources: dict, head_port: int | None = None, gcs: int = 0, dash: int = 0) -> None:
    """`ray start --head` (head_port None) or a second node joining 127.0.0.1:head_port, each with its own ports."""
    common = ["--num-cpus=2", f"--resources={json.dumps(resources)}", "--object-store-memory=500000000", "--disable-usage-stats",
              f"--temp-dir={temp_dir}", f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"]
    if head_port is None:
        args = ["start", "--head", f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}"]
    else:
        args = ["start", f"--address=127.0.0.1:{head_port}"]
    proc = ray_cli(*args, *common, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def ray_cluster(request, tmp_path):
    """A head node (custom resource learner_node) and, with param 2, a second node (rollout_node) on this machine.

    The second node runs with a HOME of its own, so its model cache (~/.cache/asyncrl/models) is empty, as on a
    machine that shares no disk with the head. Teardown is `ray stop --force`, which stops every Ray on this machine.
    """
    temp_dir = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # AF_UNIX socket paths must stay short
    env = cluster_env()
    gcs, dash = free_port(), free_port()
    try:
        start_node(env, temp_dir, {"learner_node": 1}, gcs=gcs, dash=dash)
        if getattr(request, "param", 1) == 2:
            own = {k: v for k, v in env.items() if k not in ("ASYNCRL_CACHE_DIR", "XDG_CACHE_HOME")}
            start_node({**own, "HOME": str(tmp_path / "node2-home")}, temp_dir, {"rollout_node": 1}, head_port=gcs)
        yield f"http://127.0.0.1:{dash}", env
    finally:
        ray_cli("stop", "--force", env=env, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit(address: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    proc = ray_cli("job", "submit", "--address", address, "--working-dir", ".", "--", "python", "-m", "asyncrl.run", *args, env=env)
    assert proc.returncode == 0 and "succeeded" in proc.stdout.lower(), proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc


@pytest.mark.extended  # tests/test_readme_cluster.py submits two jobs to a `ray start` head as the README writes them
def test_ray_job_submit_smoke(ray_cluster, tiny_model_dir, tmp_path):
    address, env = ray_cluster
    out = tmp_path / "run"
    proc = submit(address, env, "--config", "configs/smoke.yaml", f"run.output_dir={out}", "run.steps=3", "run.eval=false")
    assert "asyncrl: building" not in proc.stdout  # the per-user cache: the job's fresh working directory does not matter
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    assert (out / "metrics.jsonl").read_text().count("\n") == 3


@pytest.mark.parametrize("ray_cluster", [2], indirect=True)
def test_two_node_cluster_puts_rollout_and_learner_on_different_nodes(ray_cluster, tiny_model_dir, tmp_path):
    """The default model.path (tiny), as a user gives it: the rollout node's cache lacks it and copies the head's."""
    address, env = ray_cluster
    out = tmp_path / "run"
    proc = submit(address, env, "--config", "configs/smoke.yaml", f"run.output_dir={out}", "run.steps=3",
                  "run.eval=false", "learner.resources={learner_node: 1}", "rollout.resources={rollout_node: 1}")
    summary = json.loads((out / "summary.json").read_text())
    learner_nodes, rollout_nodes = set(summary["placement"]["learner_nodes"]), set(summary["placement"]["rollout_nodes"])
    assert len(learner_nodes) == len(rollout_nodes) == 1 and not learner_nodes & rollout_nodes, summary["placement"]
    assert summary["steps"] == 3 and summary["policy_version"] == 3  # weights crossed nodes every step
    assert (out / "metrics.jsonl").read_text().count("\n") == 3
    assert {"config.json", "model.safetensors"} <= {p.name for p in (out / "final_model").iterdir()}
    assert list((out / "trajectories").glob("part-*.parquet"))
    # the rollout node got the head's model byte for byte, into its own cache
    copy = tmp_path / "node2-home" / ".cache" / "asyncrl" / "models" / Path(tiny_model_dir).name
    assert manifest(copy) == manifest(Path(tiny_model_dir)), f"no copy in {copy}"
    assert "copying from the driver's node" in proc.stdout + proc.stderr  # the job's log says so
    assert (copy / "model.safetensors").read_bytes() == (Path(tiny_model_dir) / "model.safetensors").read_bytes()

