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


# ---- no import cycles, lazy imports included -----------------------------------------------------------


def project_imports(path: Path) -> set[str]:
    """The modules of this project that the source file at `path` imports (at the top, inside functions, or under
    TYPE_CHECKING: a cycle in any of them is a tangle), by dotted name."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return {mod for _, mod in imports(path.read_text(), package) if layer(mod) >= 0 and is_module(mod)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph` (module -> modules it imports): each strongly connected set of two or more
    modules, or a module importing itself (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    scc.append(top)
                    if top == node:
                        break
                if len(scc) > 1 or node in graph.get(node, ()):
                    found.append(sorted(scc))
    return found


def test_no_module_imports_itself_back():
    graph = {module_name(p): project_imports(p) - {module_name(p)} for p in SOURCES}
    assert cycles(graph) == []


def test_the_cycle_rule_catches_a_cycle_through_a_lazy_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"c"}}) == [["c"]]
    lazy = "def f():\n    from asyncrl.core import tasks\n"
    graph = {"asyncrl.core.envs": {m for _, m in imports(lazy, "asyncrl.core")}, "asyncrl.core.tasks": {"asyncrl.core.envs"}}
    assert cycles(graph) == [["asyncrl.core.envs", "asyncrl.core.tasks"]]


# ---- rooms that stay small ---------------------------------------------------------------------------------

MAX_CLASS_LINES, MAX_FUNCTION_LINES = 200, 60


def oversized(path: Path) -> dict[tuple[str, str], int]:
    """(file, name) -> lines of each class over MAX_CLASS_LINES and each function over MAX_FUNCTION_LINES."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else
                 MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if limit is not None and node.end_lineno - node.lineno + 1 > limit:
            found[(str(path.relative_to(ROOT)), node.name)] = node.end_lineno - node.lineno + 1
    return found


def test_no_class_or_function_grows_past_its_limit():
    found = {k: v for p in SOURCES if p.parts[len(ROOT.parts)] in ("asyncrl", "actors") for k, v in oversized(p).items()}
    assert not found, f"over {MAX_CLASS_LINES} lines a class, {MAX_FUNCTION_LINES} a function (lines): {found}"


def test_the_size_rule_catches_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    path = ROOT / "tests" / "_oversized_probe.py"
    try:
        path.write_text(f"def long():\n{body}\n\nclass Short:\n    pass\n")
        assert oversized(path) == {("tests/_oversized_probe.py", "long"): MAX_FUNCTION_LINES + 1}
    finally:
        path.unlink()
