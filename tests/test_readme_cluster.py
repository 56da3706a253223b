"""The README's cluster commands, typed as written into a fresh shell: `ray start --head`, `ray job submit`
(twice: the second job must find the model the first one used), `ray stop`."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster]


def readme_block() -> list[str]:
    """The bash block under the README's `cluster-commands` marker, one command a line (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- cluster-commands.*?-->\s*```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no cluster-commands block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_block_is_what_this_test_expects():
    lines = readme_block()
    assert lines[-1] == "ray stop" and any(line.startswith("ray start --head") for line in lines)
    assert sum(line.startswith("ray job submit") for line in lines) == 1


def test_readme_cluster_commands_as_written(tiny_model_dir):
    lines = readme_block()
    submit = next(line for line in lines if line.startswith("ray job submit"))
    script = "\n".join(["set -euo pipefail", *lines[:-1], submit, "ray stop"])
    # a fresh shell: nothing of this session's Ray settings (the README must say all that is needed)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "VIRTUAL_ENV"}
    out = ROOT / "runs" / "cluster-smoke"
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    finally:
        subprocess.run(["bash", "-c", "source .venv/bin/activate && ray stop --force"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.stdout.count("succeeded") >= 2, proc.stdout[-4000:]
    assert "asyncrl: building" not in proc.stdout  # both jobs found the model in the per-user cache (tiny_model_dir built it)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["samples"]["consumed"] > 0
