"""The layers, from the ground floor up; an import that goes the wrong way fails here.

    algorithms/              the plugins' math (ground floor; installed as asyncrl.algorithms)
    asyncrl/core/            config, schema, store, staleness, tasks, weights, metrics, models, ...
    asyncrl/analysis/        reading run directories back
    actors/                  the Ray actors (installed as asyncrl.actors)
    asyncrl/orchestration/   the controller: pools, step loop, weight-sync coordination
    asyncrl/run.py, inspect.py, plot.py   the entry points

A module may import its own layer and the layers below it, never one above. Imports inside functions count.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["asyncrl.algorithms", "asyncrl.core", "asyncrl.analysis", "asyncrl.actors", "asyncrl.orchestration", "asyncrl"]
MAPPED = {"actors": "asyncrl.actors", "algorithms": "asyncrl.algorithms"}
"""Folders of the repo installed under another package name (pyproject.toml's package-dir)."""
"""Lowest first; `asyncrl` alone is its top floor (the entry points and the package itself)."""


def layer(module: str) -> int:
    """The layer of a dotted module name of this project (the longest matching prefix), -1 for anything else."""
    best = -1
    for i, prefix in enumerate(LAYERS):
        if (module == prefix or module.startswith(prefix + ".")) and (best < 0 or len(prefix) > len(LAYERS[best])):
            best = i
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = MAPPED.get(parts[0], parts[0])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_path(dotted: str) -> Path:
    """Where a dotted module of this project lives in the repo (without .py)."""
    for folder, package in MAPPED.items():
        if dotted == package or dotted.startswith(package + "."):
            dotted = folder + dotted[len(package):]
    return ROOT / dotted.replace(".", "/")


def is_module(dotted: str) -> bool:
    path = source_path(dotted)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(source: str, package: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in `source`, a module of `package`; relative ones resolved, and
    `from asyncrl.core import tasks` counted as the submodule asyncrl.core.tasks."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found += [(node.lineno, f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base) for a in node.names]
    return found


def upward(module: str, source: str, package: str) -> list[str]:
    mine = layer(module)
    return [f"line {line}: {mod} ({LAYERS[layer(mod)]})" for line, mod in imports(source, package) if layer(mod) > mine]


SOURCES = sorted(p for d in ("algorithms", "asyncrl", "actors") for p in (ROOT / d).rglob("*.py"))


def test_every_source_file_has_a_layer():
    assert SOURCES and all(layer(module_name(p)) >= 0 for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_go_down(path):
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    wrong = upward(module, path.read_text(), package)
    assert not wrong, f"{path.relative_to(ROOT)} ({LAYERS[layer(module)]}) imports a layer above it: {wrong}"


def test_the_rule_catches_an_upward_import():
    assert layer("asyncrl.core.config") < layer("asyncrl.actors.learner") < layer("asyncrl.orchestration.controller") < layer("asyncrl.run")
    assert layer("asyncrl.analysis.runs") < layer("asyncrl.actors.rollout") and layer("asyncrl.algorithms.grpo") == 0 and layer("numpy") == -1
    lazy = "import torch\n\ndef f():\n    from asyncrl.actors.learner import Learner\n    return Learner\n"
    assert upward("asyncrl.core.weights", lazy, "asyncrl.core") == ["line 4: asyncrl.actors.learner (asyncrl.actors)"]
    assert upward("asyncrl.core.models.tiny", "from .. import tasks\nfrom . import cache\n", "asyncrl.core.models") == []
    assert upward("asyncrl.actors.buffer", "from asyncrl import run\n", "asyncrl.actors") == ["line 1: asyncrl.run (asyncrl)"]
    assert upward("asyncrl.core.config", "from asyncrl.orchestration import controller\n", "asyncrl.core") == [
        "line 1: asyncrl.orchestration.controller (asyncrl.orchestration)"]
