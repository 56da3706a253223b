"""notebooks/analysis.ipynb executes without errors (nbclient, a kernel on this interpreter).

The slow test runs it against a real smoke run; the fast ones check the
committed file is clean and that it runs on a killed run (synthetic, no
summary.json).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from asyncrl.plot import FIGURES, make_plots
from tests.test_e2e import run_smoke
from tests.test_plot import write_run

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"
KERNEL = "asyncrl-test"


@pytest.fixture
def kernel(tmp_path, monkeypatch) -> str:
    """A kernel spec running ipykernel on this very interpreter, found through JUPYTER_PATH."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


def execute(run_dir: Path, kernel_name: str, monkeypatch) -> list[dict]:
    """Runs every cell against run_dir (CellExecutionError on the first failing cell); returns the outputs."""
    monkeypatch.setenv("ASYNCRL_RUN_DIR", str(run_dir))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name=kernel_name, timeout=300, resources={"metadata": {"path": str(ROOT)}}).execute()
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def text_of(outputs: list[dict]) -> str:
    return "\n".join(out.get("text", "") + out.get("data", {}).get("text/plain", "") for out in outputs)


WITHOUT_EVAL = sorted(set(FIGURES) - {"eval.png"})
"""The figures of a run that logged no validation during training (eval.png needs run.eval_every's eval/ keys)."""


def images_in(outputs: list[dict]) -> int:
    return sum("image/png" in out.get("data", {}) for out in outputs)


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.id


def test_notebook_on_a_killed_run(tmp_path, kernel, monkeypatch):
    run_dir = write_run(tmp_path / "killed", torn_tail=True)
    outputs = execute(run_dir, kernel, monkeypatch)
    assert not [o for o in outputs if o.output_type == "error"]
    text = text_of(outputs)
    assert "not finished" in text and "no summary.json" in text
    assert "balanced" in text or "bound" in text
    assert images_in(outputs) == len(WITHOUT_EVAL)


@pytest.fixture(scope="module")
def smoke_run(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smoke_notebook")
    run_smoke(out, tiny_model_dir, "run.steps=4", "run.eval=false", "logging.wandb=false")
    return out


@pytest.mark.slow
def test_notebook_on_a_smoke_run(smoke_run, kernel, monkeypatch):
    outputs = execute(smoke_run, kernel, monkeypatch)
    assert not [o for o in outputs if o.output_type == "error"]
    text = text_of(outputs)
    assert "bound" in text or "balanced" in text
    assert '"steps": 4' in text  # the summary
    assert "effective rate" in text and "reward=" in text  # status counts and example trajectories
    assert images_in(outputs) == len(WITHOUT_EVAL)


@pytest.mark.slow
def test_plot_cli_on_a_smoke_run(smoke_run):
    paths = make_plots(smoke_run)
    assert sorted(p.name for p in paths) == WITHOUT_EVAL
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
