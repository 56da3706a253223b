"""The package as a user installs it: the built wheel in a clean virtual environment, a job run from outside the repo.

The wheel is built from a copy of the sources (a stale build/ folder cannot leak removed modules into it), installed
with --no-deps into a new virtual environment whose only other path is this environment's site-packages (a path line
in a .pth file: the editable install's finder there is not run, so `asyncrl` can only come from the wheel), and the
`asyncrl` console script runs a job from a directory that is not the repo.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCES = shutil.ignore_patterns(".venv", ".git", "runs", "build", "dist", "site", "__pycache__", "*.egg-info", ".venv-trl*", "wandb", ".pytest_cache")


def build_wheel(out: Path) -> Path:
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES, symlinks=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)], check=True)
    (wheel,) = out.glob("asyncrl-*.whl")
    return wheel


def clean_venv(path: Path) -> Path:
    """A new virtual environment that sees this one's dependencies but not its (editable) asyncrl."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    (purelib,) = path.glob("lib/python3*/site-packages")
    (purelib / "asyncrl-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return path / "bin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the bin/ of a clean virtual environment with it installed)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    bin_dir = clean_venv(tmp / "venv")
    subprocess.run([str(bin_dir / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    return wheel, bin_dir


def user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV")}


@pytest.mark.slow
def test_the_wheel_installs_only_the_asyncrl_name_and_the_command(installed):
    wheel, bin_dir = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"asyncrl", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in ("asyncrl/actors/learner.py", "asyncrl/algorithms/grpo.py", "asyncrl/cli.py", "asyncrl/core/config.py"):
        assert module in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "asyncrl = asyncrl.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    where = subprocess.run([str(bin_dir / "python"), "-c", "import asyncrl.actors.learner as m, importlib.util as u; "
                            "print(m.__file__); print(u.find_spec('actors'), u.find_spec('algorithms'))"],
                           cwd=bin_dir.parent, env=user_env(), capture_output=True, text=True, check=True).stdout.split("\n")
    assert where[0].startswith(str(bin_dir.parent)) and where[1] == "None None"


JOB = """\
model: {path: tiny}
task: {eval_size: 20}
rollout: {group_size: 4, max_new_tokens: 6, max_inflight_groups: 8}
buffer: {capacity_groups: 16}
learner: {batch_size: 16, micro_batch_size: 16}
logging: {wandb: false}
run: {steps: 2, output_dir: out, checkpoint_every: 0, ray_address: local}
"""


@pytest.mark.slow
def test_the_installed_command_runs_a_job_from_outside_the_repo(installed, tmp_path):
    _, bin_dir = installed
    (tmp_path / "job.yaml").write_text(JOB)
    done = subprocess.run([str(bin_dir / "asyncrl"), "run", "--config", "job.yaml"], cwd=tmp_path, env=user_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "asyncrl run summary" in done.stdout
    summary = (tmp_path / "out" / "summary.json").read_text()
    assert '"steps": 2' in summary
    assert (tmp_path / "out" / "final_model" / "config.json").is_file()
