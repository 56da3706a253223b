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

from asyncrl.weights import free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster]


def ray_cli(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    ray_bin = str(Path(sys.executable).with_name("ray"))
    return subprocess.run([ray_bin, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def ray_head():
    """A head node of its own (note: teardown is `ray stop --force`, which stops every Ray on this machine)."""
    temp_dir = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # AF_UNIX socket paths must stay short
    # Ray >= 2.59 turns on token auth for local clusters: give head and client the same token
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    env.pop("RAY_ADDRESS", None)
    gcs, dash = free_port(), free_port()
    proc = ray_cli("start", "--head", f"--port={gcs}", "--num-cpus=2", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                   f"--dashboard-port={dash}", "--disable-usage-stats", f"--temp-dir={temp_dir}", env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        yield f"http://127.0.0.1:{dash}", env
    finally:
        ray_cli("stop", "--force", env=env, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_smoke(ray_head, tiny_model_dir, tmp_path):
    address, env = ray_head
    out = tmp_path / "run"
    proc = ray_cli(
        "job", "submit", "--address", address, "--working-dir", ".", "--",
        "python", "-m", "asyncrl.run", "--config", "configs/smoke.yaml",
        f"run.output_dir={out}", f"model.path={tiny_model_dir}", "run.steps=3", "run.eval=false",
        env=env,
    )
    assert proc.returncode == 0 and "succeeded" in proc.stdout.lower(), proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    assert (out / "metrics.jsonl").read_text().count("\n") == 3
