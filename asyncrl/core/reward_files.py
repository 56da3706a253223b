"""Rewards from a Python file (``task.reward: path/to/file.py:fn``), and verl-style ``compute_score`` functions.

A reward is called as ``fn(prompt, response) -> float`` (asyncrl.core.tasks). Two more forms are accepted:

- the file form, ``path/to/file.py:fn``: no package to install. A relative path is made absolute against the
  current directory when the config is loaded (`absolute_reward_name`), and the run's config.yaml records it so.
- verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``, recognised by its signature: a
  function with a parameter named ``solution_str`` (the name verl passes by keyword) is adapted (`VerlReward`):
  data_source and extra_info come from the prompt's record, ground_truth from its ``reward_model.ground_truth``
  column (verl's layout) or else the prompt's answer; a returned dict gives its ``"score"``.

How the file reaches every node: Ray's runtime environment ships it with the job, ``py_modules=[the file]``
(`reward_runtime_env`, given to ``ray.init``): Ray uploads the one file once per job and puts it on the
PYTHONPATH of every worker process, the reward actors' scoring processes included (they inherit it). Chosen over
shipping the file's source text inside the reward spec, because then every place that builds a reward from its
name (rollout workers, reward actors, their child processes, evaluation) would need that text passed alongside
the name, while with py_modules the name alone suffices, as for a dotted path; and over py_modules of the file's
folder, because that folder often holds the data files as well (uploaded with every job) and would put every
module in it on the workers' path. The price: the file is importable by its name on the workers, so a file named
like a module that is already importable (``json.py``) would shadow it there; `check_reward_file` refuses such a
name before Ray starts. A reward that imports helper modules of its own is better made a package (dotted path).

Where the file is at its path (the driver's node, a shared filesystem) it is loaded from there; elsewhere from
the copy Ray shipped, imported by its name.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from asyncrl.core.prompts import Prompt, Record, RewardFn

FILE_FORM = re.compile(r"^(?P<path>.+\.py):(?P<fn>[A-Za-z_]\w*)$")
VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")
SIGNATURES = "fn(prompt, response) -> float, or verl's compute_score(data_source, solution_str, ground_truth, extra_info)"


def reward_file_spec(name: str) -> tuple[str, str] | None:
    """(path, function name) of a ``file.py:fn`` reward; None for a registered name or a dotted path."""
    match = FILE_FORM.match(name)
    return (match["path"], match["fn"]) if match else None


def absolute_reward_name(name: str, cwd: Path | None = None) -> str:
    """`name` with the file of a ``file.py:fn`` reward made absolute against `cwd` (the current directory)."""
    spec = reward_file_spec(name)
    if spec is None or Path(spec[0]).is_absolute():
        return name
    return f"{((cwd or Path.cwd()) / spec[0]).resolve()}:{spec[1]}"


def reward_runtime_env(name: str) -> dict:
    """What the job's Ray runtime environment needs for the reward `name`: its file, for a ``file.py:fn`` reward."""
    spec = reward_file_spec(name)
    return {"py_modules": [spec[0]]} if spec is not None else {}


def check_reward_file(name: str) -> None:
    """Before Ray starts: the file of a ``file.py:fn`` reward exists and its name shadows no importable module."""
    spec = reward_file_spec(name)
    if spec is None:
        return
    path = Path(spec[0])
    if not path.is_file():
        raise ValueError(f"task.reward: reward file not found: {path}")
    found = importlib.util.find_spec(path.stem) if path.stem not in sys.modules else None
    origin = sys.modules[path.stem].__file__ if path.stem in sys.modules else (found.origin if found else None)
    if origin is not None and Path(origin).resolve() != path.resolve():
        raise ValueError(f"task.reward: the file's name {path.name!r} is the name of an importable module ({origin}), "
                         "which it would shadow on the Ray workers: rename the file")


def load_reward_file(path: str, fn_name: str) -> Callable:
    """The function `fn_name` of the Python file at `path` (or of the copy Ray shipped, where the path is absent)."""
    module = _module_from_file(Path(path)) if Path(path).is_file() else _shipped_module(Path(path))
    fn = getattr(module, fn_name, None)
    if fn is None:
        names = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__)
        raise ValueError(f"task.reward: {path} has no {fn_name!r} (its functions: {', '.join(names) or 'none'})")
    return fn


def _module_from_file(path: Path) -> ModuleType:
    """The module of the file at `path`, executed once per process, under its file name (as the workers import it)."""
    known = sys.modules.get(path.stem)
    if known is not None and getattr(known, "__file__", None) and Path(known.__file__).resolve() == path.resolve():
        return known
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # before it runs: a dataclass in the file looks its module up there
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[path.stem]
        raise ValueError(f"task.reward: loading {path} raised {exc!r}") from exc
    return module


def _shipped_module(path: Path) -> ModuleType:
    try:
        return importlib.import_module(path.stem)
    except ImportError:
        raise ValueError(f"task.reward: reward file not found: {path} (and no copy shipped with the job's "
                         "runtime_env on this node)") from None


def as_reward(fn: object, name: str) -> RewardFn:
    """`fn` as a reward: as it is when it takes (prompt, response), adapted when it is verl-style (a parameter named
    solution_str); a ValueError naming `name` when it is neither."""
    if not callable(fn):
        raise ValueError(f"task.reward: {name!r} is not callable")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: taken at its word
        return fn  # type: ignore[return-value]
    if "solution_str" in sig.parameters:
        if not _binds(sig, (), {k: None for k in VERL_PARAMETERS}):
            raise ValueError(f"task.reward: {name!r} takes {sig}, which names verl's solution_str but cannot be "
                             f"called with {', '.join(VERL_PARAMETERS)}")
        return VerlReward(fn)
    if not _binds(sig, (None, None), {}):
        raise ValueError(f"task.reward: {name!r} takes {sig}; a reward is {SIGNATURES}")
    return fn  # type: ignore[return-value]


def _binds(sig: inspect.Signature, args: tuple, kwargs: dict) -> bool:
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


class VerlReward:
    """A verl-style ``compute_score(data_source, solution_str, ground_truth, extra_info)`` as ``reward(prompt,
    response) -> float``; keeps what `@reward` said of it (deterministic, version)."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        traits = getattr(fn, "asyncrl_reward", None)
        if traits is not None:
            if traits.batched:
                raise ValueError("task.reward: a verl-style compute_score is called per sample; drop batched=True")
            self.asyncrl_reward = traits

    def __call__(self, prompt: Prompt, response: str) -> float:
        return verl_score(self.fn(**verl_arguments(prompt, response)))


def verl_arguments(prompt: Prompt, response: str) -> dict[str, Any]:
    """The keywords verl calls compute_score with, from a prompt's record (plain dicts, as verl passes them)."""
    record = prompt.record
    model = record.get("reward_model")
    has_truth = isinstance(model, Record) and "ground_truth" in model
    extra = record.get("extra_info")
    return {
        "data_source": record.get("data_source", ""),
        "solution_str": response,
        "ground_truth": model.to_dict()["ground_truth"] if has_truth else prompt.answer,
        "extra_info": extra.to_dict() if isinstance(extra, Record) else extra,
    }


def verl_score(value: Any) -> float:
    """A verl result as a float: a number, or a dict's ``"score"`` (verl's rewards may return both forms)."""
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"verl-style reward returned a dict without 'score' (keys: {', '.join(map(str, value))})")
        value = value["score"]
    return float(value)
