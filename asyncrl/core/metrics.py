"""Metric sinks: metrics.jsonl in the run directory, wandb, and a console line per step."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from asyncrl.core.checkpoint import truncate_metrics

CONSOLE_KEYS = (
    ("step", "step", "{:>4.0f}"),
    ("policy_version", "v", "{:>3.0f}"),
    ("reward/mean", "reward", "{:.3f}"),
    ("kl/ref", "kl_ref", "{:.4f}"),
    ("staleness/mean", "stale", "{:.2f}"),
    ("rollout/tokens_per_s", "tok/s", "{:>6.0f}"),
    ("time/step_s", "step_s", "{:.2f}"),
    ("time/learner_wait_s", "wait_s", "{:.2f}"),
    ("eval/accuracy", "eval_acc", "{:.3f}"),  # only on the steps run.eval_every validates
)


def wandb_mode(requested: str) -> str:
    """auto -> online when an API key is configured, else offline."""
    if requested != "auto":
        return requested
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def console_line(metrics: dict[str, Any]) -> str:
    parts = [f"{label}={fmt.format(metrics[k])}" for k, label, fmt in CONSOLE_KEYS if k in metrics]
    return "  ".join(parts)


class MetricsSink:
    def __init__(self, run_dir: Path, config: dict, use_wandb: bool, project: str, mode: str, console: bool, resume_id: str | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.file = self.path.open("a")
        self.console = console
        self.wandb = None
        if use_wandb:
            import wandb

            self.wandb = wandb.init(
                project=project, dir=str(run_dir), config=config, mode=wandb_mode(mode), name=run_dir.name,
                id=resume_id, resume="allow" if resume_id else None,
            )
            (run_dir / "wandb_run_id").write_text(self.wandb.id)

    def log(self, metrics: dict[str, Any], histograms: dict[str, list[float]] | None = None) -> None:
        """One step: a line in metrics.jsonl, a wandb step (with `histograms` as wandb.Histogram), a console line."""
        self.file.write(json.dumps(metrics) + "\n")
        self.file.flush()
        if self.wandb is not None:
            import wandb

            hists = {k: wandb.Histogram(v) for k, v in (histograms or {}).items() if v}
            self.wandb.log({**metrics, **hists}, step=int(metrics["step"]))
        if self.console:
            print(console_line(metrics), file=sys.stdout, flush=True)

    def rewind(self, next_step: int) -> None:
        """The steps from `next_step` on will be redone (a learner restored from its checkpoint): their rows leave
        metrics.jsonl. wandb keeps what it was sent (its steps only go forward): the redone steps' rows there are
        the first attempt's."""
        self.file.close()
        truncate_metrics(self.path, next_step)
        self.file = self.path.open("a")

    def summary(self, values: dict[str, Any]) -> None:
        if self.wandb is not None:
            self.wandb.summary.update(values)

    def close(self) -> None:
        self.file.close()
        if self.wandb is not None:
            self.wandb.finish()
