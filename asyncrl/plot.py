"""Plots of a run directory: `python -m asyncrl.plot RUN_DIR [--out DIR]`.

Writes reward.png, kl.png, is_ratio.png, staleness.png, timeline.png, running.png
(requests in each engine per engine step), lengths.png (response lengths) and, for a
run with validation during training (run.eval_every), eval.png into
RUN_DIR/plots/ (or --out) and prints each path. A figure whose data the run
lacks (a metric never logged, no trajectories yet) is skipped, not an error, so
a run killed mid-way plots what it has.

One function per figure, each `(run) -> Figure | None`; the notebook
(notebooks/analysis.ipynb) displays the same figures. Figures are built on the
Agg canvas directly (no pyplot, no global backend switch), so importing this
module changes nothing for an interactive session.
"""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from asyncrl.analysis.runs import Run, load_run

KL_KEYS = ("kl/ref", "kl/ref_k1", "kl/ref_k2", "kl/ref_k3", "kl/behavior")
IS_RATIO_KEYS = ("is_ratio/mean", "is_ratio/max", "is_ratio/min")
EVAL_KEYS = ("eval/accuracy", "eval/pass_at_1", "eval/pass_at_k")
GENERATED_STATUSES = ("consumed", "dropped_stale", "dropped_error")
"""Samples whose generation finished (the timeline's dots)."""


def new_figure(width: float = 7.0, height: float = 3.6) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def step_axis(ax: Axes) -> None:
    ax.set_xlabel("learner step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def series(metrics: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the rows that logged `key` with a number."""
    steps, values = [], []
    for i, row in enumerate(metrics):
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(float(row.get("step", i)))
            values.append(float(value))
    return steps, values


def column(run: Run, name: str) -> list:
    return run.trajectories.column(name).to_pylist() if name in run.trajectories.column_names else []


def reward_figure(run: Run) -> Figure | None:
    steps, mean = series(run.metrics, "reward/mean")
    if not steps:
        return None
    fig, ax = new_figure()
    ax.plot(steps, mean, marker=".", label="reward/mean")
    std_steps, std = series(run.metrics, "reward/std")
    if std_steps == steps:
        ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                        alpha=0.25, label="± reward/std")
    ax.set(title="Reward", ylabel="reward")
    step_axis(ax)
    ax.legend(loc="best")
    return fig


def lines_figure(run: Run, keys: Sequence[str], title: str, ylabel: str, log: bool = False) -> Figure | None:
    """One line per key that the run logged; None when it logged none of them."""
    found = [(key, *series(run.metrics, key)) for key in keys]
    found = [(key, x, y) for key, x, y in found if x]
    if not found:
        return None
    fig, ax = new_figure()
    for i, (key, x, y) in enumerate(found):  # the first (headline) key drawn wide, so one drawn over it shows
        ax.plot(x, y, marker=".", label=key, **({"linewidth": 4, "alpha": 0.5} if i == 0 else {}))
    if log:
        ax.set_yscale("log", nonpositive="mask")
    ax.set(title=title, ylabel=ylabel)
    step_axis(ax)
    ax.legend(loc="best")
    return fig


def kl_figure(run: Run) -> Figure | None:
    return lines_figure(run, KL_KEYS, "KL to the reference and to the behaviour policy", "KL")


def is_ratio_figure(run: Run) -> Figure | None:
    return lines_figure(run, IS_RATIO_KEYS, "Importance ratio π_prox / π_behav", "ratio (log)", log=True)


def eval_figure(run: Run) -> Figure | None:
    """Held-out accuracy of the version each validating step published (run.eval_every; none: no figure)."""
    k = (run.config or {}).get("run", {}).get("eval_pass_k", "k")
    fig = lines_figure(run, EVAL_KEYS, f"Validation during training (pass@k: k={k})", "held-out accuracy")
    if fig is not None:
        fig.axes[0].set_ylim(-0.02, 1.02)
    return fig


def consumed_staleness(run: Run) -> list[int]:
    """consumed_version − policy_version_start of every consumed sample."""
    rows = zip(column(run, "status"), column(run, "consumed_version"), column(run, "policy_version_start"))
    return [used - start for status, used, start in rows if status == "consumed" and None not in (used, start)]


def staleness_figure(run: Run) -> Figure | None:
    values = consumed_staleness(run)
    if values:
        fig, ax = new_figure()
        bins = [b - 0.5 for b in range(min(values), max(values) + 2)]
        ax.hist(values, bins=bins, rwidth=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(title=f"Staleness of consumed samples (n={len(values)})",
               xlabel="consumed_version − policy_version_start", ylabel="samples")
        return fig
    return lines_figure(run, ("staleness/mean", "staleness/max"), "Staleness per step (no trajectories)", "versions")


def timeline_origin(run: Run, windows: Sequence[tuple[float, float]]) -> float:
    """The earliest recorded time: first sample submitted or first learner step."""
    times = [t for name in ("t_submitted", "t_generated") for t in column(run, name) if isinstance(t, float)]
    starts = [a for a, _ in windows] + [t for t in times if math.isfinite(t)]
    return min(starts) if starts else 0.0


def train_windows(metrics: Sequence[dict]) -> list[tuple[float, float]]:
    """(time/train_start, time/train_end) of each step that logged both."""
    windows = []
    for row in metrics:
        a, b = row.get("time/train_start"), row.get("time/train_end")
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b >= a:
            windows.append((float(a), float(b)))
    return windows


def generation_events(run: Run) -> list[tuple[int, float, str]]:
    """(worker_id, t_generated, status) of every sample whose generation finished."""
    rows = zip(column(run, "worker_id"), column(run, "t_generated"), column(run, "status"))
    return [(w if w is not None else -1, t, s) for w, t, s in rows
            if s in GENERATED_STATUSES and isinstance(t, float) and math.isfinite(t)]


def timeline_figure(run: Run) -> Figure | None:
    """Learner busy windows (top row) against sample completions per rollout worker."""
    windows = train_windows(run.metrics)
    events = generation_events(run)
    if not windows and not events:
        return None
    t0 = timeline_origin(run, windows)
    workers = sorted({w for w, _, _ in events})
    fig, ax = new_figure(9.0, 1.6 + 0.5 * (len(workers) + 1))
    ax.broken_barh([(a - t0, b - a) for a, b in windows], (-0.35, 0.7), color="tab:orange", label="learner training")
    for a, b in windows:
        ax.axvspan(a - t0, b - t0, color="tab:orange", alpha=0.12, linewidth=0)
    for status, color in zip(GENERATED_STATUSES, ("tab:blue", "tab:red", "black")):
        points = [(t - t0, 1 + workers.index(w)) for w, t, s in events if s == status]
        if points:
            ax.scatter(*zip(*points), marker="|", s=120, color=color, label=f"sample generated ({status})")
    ax.set_yticks(range(len(workers) + 1), ["learner", *[f"rollout w{w}" for w in workers]])
    ax.set_ylim(-0.7, len(workers) + 0.7)
    ax.invert_yaxis()
    ax.set(title="Timeline: generation against learner steps", xlabel="seconds since run start")
    fig.legend(loc="outside lower center", ncol=3, fontsize="small", frameon=False)
    return fig


def running_figure(run: Run) -> Figure | None:
    """Requests in each engine at every engine step, over time, against the learner's training windows: where the
    count falls to a few, the engine is finishing the long tail (in synchronous mode, with the learner waiting)."""
    if not run.engine_trace:
        return None
    windows = train_windows(run.metrics)
    points: dict[int, tuple[list[float], list[int]]] = {}
    for row in run.engine_trace:
        t, n = points.setdefault(row["worker"], ([], []))
        t.extend(row["t"])
        n.extend(row["running"])
    t0 = min([min(t) for t, _ in points.values()] + [a for a, _ in windows])
    fig, ax = new_figure(9.0, 3.6)
    for a, b in windows:
        ax.axvspan(a - t0, b - t0, color="tab:orange", alpha=0.12, linewidth=0)
    for worker, (t, n) in sorted(points.items()):
        ax.step([x - t0 for x in t], n, where="post", linewidth=0.8, label=f"rollout w{worker}")
    ax.set(title="Running requests per engine step (shaded: learner training)", xlabel="seconds since run start", ylabel="requests")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best")
    return fig


def length_figure(run: Run) -> Figure | None:
    """Histogram of generated response lengths, those cut at the limit apart: the tail a synchronous step waits on."""
    rows = [(len(ids), reason) for ids, reason in zip(column(run, "response_ids"), column(run, "finish_reason")) if ids]
    if not rows:
        return None
    fig, ax = new_figure()
    stopped = [n for n, reason in rows if reason != "length"]
    cut = [n for n, reason in rows if reason == "length"]
    ax.hist([stopped, cut], bins=40, stacked=True, label=["ended (EOS)", "cut at max_new_tokens"], color=["tab:blue", "tab:red"])
    ax.set(title=f"Response lengths (n={len(rows)})", xlabel="tokens", ylabel="samples")
    ax.legend(loc="best")
    return fig


FIGURES: dict[str, Callable[[Run], Figure | None]] = {
    "reward.png": reward_figure,
    "kl.png": kl_figure,
    "is_ratio.png": is_ratio_figure,
    "staleness.png": staleness_figure,
    "timeline.png": timeline_figure,
    "running.png": running_figure,
    "lengths.png": length_figure,
    "eval.png": eval_figure,
}


def make_plots(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Writes every figure the run has data for; returns the paths written."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in FIGURES.items():
        fig = build(run)
        if fig is not None:
            fig.savefig(out / name, dpi=110)
            written.append(out / name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncrl.plot", description="Plot an asyncrl run directory.")
    parser.add_argument("run_dir", type=Path, help="the run's output_dir (metrics.jsonl, trajectories/)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the PNGs (default RUN_DIR/plots)")
    args = parser.parse_args(argv)
    try:
        paths = make_plots(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as err:
        print(f"asyncrl.plot: {err}", file=sys.stderr)
        return 2
    if not paths:
        print(f"asyncrl.plot: nothing to plot yet in {args.run_dir}", file=sys.stderr)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
