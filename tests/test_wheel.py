"""The package as a user installs it: the built wheel in a clean virtual environment, a job run from outside the repo.

The wheel is built from a copy of the sources (a stale build/ folder cannot leak removed modules into it), installed
with --no-deps into a new virtual environment whose only other path is this environment's site-packages (a path line
in a .pth file: the editable install's finder there is not run, so `asyncrl` can only come from the wheel), and the
`asyncrl` console script runs a user's job (data files, reward file) from a directory that is not the repo.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from asyncrl.core.store import read_trajectories

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


REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature; worth the record's extra_info["weight"] (0.5 in every record: a reward of 1.0 would mean
    the column never reached it)."""
    return extra_info["weight"] * float(solution_str.strip() == ground_truth)
'''

JOB = """\
model: {path: tiny}
task: {name: dataset, reward: reward.py:compute_score, eval_size: 20}
data: {train: data/train.parquet, val: data/val.parquet, answer_key: reward_model.ground_truth}
rollout: {group_size: 4, max_new_tokens: 6, max_inflight_groups: 8}
buffer: {capacity_groups: 16}
learner: {batch_size: 16, micro_batch_size: 16}
logging: {wandb: false}
run: {steps: 2, output_dir: out, checkpoint_every: 2, eval_every: 1, eval_pass_k: 2, ray_address: local}
"""


def verl_records(n: int, seed: int, split: str) -> list[dict]:
    """verl's Parquet layout (data_source, prompt, ability, reward_model.ground_truth, extra_info) with the 2-digit
    "a+b=" prompts the tiny model reads, as plain text: it has no chat template (chat-message prompts:
    tests/test_datasets.py)."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(100), rng.randrange(100)) for _ in range(n)]
    return [{"data_source": "addition", "prompt": f"{a}+{b}=", "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"split": split, "index": i, "weight": 0.5}} for i, (a, b) in enumerate(pairs)]


@pytest.mark.slow
def test_the_installed_command_trains_on_your_data_and_reward_from_outside_the_repo(installed, tmp_path):
    """What a user does with the wheel: their verl-layout Parquet files, a separate validation file and a verl-style
    reward in a file of their own, given by relative paths, with validation during training; then `asyncrl export`,
    `inspect` and `plot` on the run."""
    _, bin_dir = installed
    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pylist(verl_records(200, 0, "train")), tmp_path / "data" / "train.parquet")
    pq.write_table(pa.Table.from_pylist(verl_records(20, 1, "test")), tmp_path / "data" / "val.parquet")
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "job.yaml").write_text(JOB)

    def asyncrl(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([str(bin_dir / "asyncrl"), *args], cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    assert "asyncrl run summary" in asyncrl("run", "--config", "job.yaml").stdout
    out = tmp_path / "out"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    # validated every step: version 1 next to step 1's training, version 2 (the last) at once; the last row holds it
    assert metrics[-1]["eval/policy_version"] == 2 and 0.0 <= metrics[-1]["eval/accuracy"] <= 0.5 and "eval/pass_at_k" in metrics[-1]
    rows = read_trajectories(out / "trajectories").to_pylist()
    trained = [r for r in rows if r["status"] == "consumed"]
    assert len(trained) == 2 * 16
    assert {r["reward"] for r in trained} <= {0.0, 0.5} and any(r["reward"] == 0.5 for r in trained)  # extra_info reached it
    assert {r["prompt_text"] for r in trained} <= {rec["prompt"] for rec in verl_records(200, 0, "train")}  # train records only
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and 0.0 < summary["eval/accuracy_after"] <= 0.5  # the val file, scored by the same reward
    assert yaml.safe_load((out / "config.yaml").read_text())["task"]["reward"] == f"{tmp_path}/reward.py:compute_score"

    asyncrl("export", "out")
    (exported,) = (out / "exports").iterdir()
    assert (exported / "config.json").is_file() and (exported / "model.safetensors").is_file()
    assert "consumed" in asyncrl("inspect", "out").stdout
    asyncrl("plot", "out")
    assert (out / "plots" / "eval.png").is_file()
