"""Create a wandb workspace (a saved view) laying out asyncrl's panels.

    python -m asyncrl.analysis.dashboard [--entity TEAM] [--project asyncrl] [--name "asyncrl overview"]

Needs to be online (WANDB_API_KEY set, or `wandb login`). Offline it prints
what to do instead and exits 1: offline runs live in RUN_DIR/wandb/ and can be
uploaded later with `wandb sync`, after which this command lays them out.
Uses the `wandb-workspaces` package (W&B's public-preview Workspaces API).
"""
from __future__ import annotations

import argparse
import netrc
import os
import sys

# section title -> metrics, one line plot each (names as in docs/metrics.md)
SECTIONS: list[tuple[str, list[str]]] = [
    ("Reward", ["reward/mean", "reward/std", "samples/response_len_mean"]),
    ("KL", ["kl/ref", "kl/behavior", "kl/ref_k1", "kl/ref_k2", "kl/ref_k3"]),
    ("Importance ratios", ["is_ratio/mean", "is_ratio/max", "is_ratio/ess", "is_ratio/truncated_frac", "loss/clip_frac_high"]),
    ("Staleness", ["staleness/mean", "staleness/max", "buffer/buffered_groups", "buffer/refused_admissions"]),
    ("Throughput", ["rollout/tokens_per_s", "samples/effective_rate", "samples/cost_per_1k_effective", "rollout/idle_frac"]),
    ("Where the time goes", ["time/step_s", "time/learner_wait_frac", "time/learner_compute_s", "time/weight_sync_frac"]),
    ("Learner health", ["learner/entropy", "learner/grad_norm", "learner/skipped_total", "learner/lr"]),
]


def is_online() -> bool:
    """An API key in the environment or from `wandb login` (~/.netrc), and WANDB_MODE not offline."""
    if os.environ.get("WANDB_MODE") == "offline":
        return False
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def build_workspace(entity: str, project: str, name: str):
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as exc:
        raise SystemExit(f"asyncrl: the dashboard needs wandb-workspaces: pip install 'asyncrl[demo]' ({exc})") from None

    sections = [ws.Section(name=title, panels=[wr.LinePlot(x="Step", y=[key]) for key in keys], is_open=True) for title, keys in SECTIONS]
    return ws.Workspace(name=name, entity=entity, project=project, sections=sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncrl.analysis.dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--entity", default=os.environ.get("WANDB_ENTITY", ""), help="team or user (default: your default entity)")
    parser.add_argument("--project", default="asyncrl")
    parser.add_argument("--name", default="asyncrl overview")
    args = parser.parse_args(argv)
    if not is_online():
        print(
            "asyncrl.analysis.dashboard: wandb is offline (no WANDB_API_KEY and no `wandb login`), so there is no workspace to create.\n"
            "  Runs are logged offline to RUN_DIR/wandb/offline-run-*; to see them in wandb:\n"
            "    wandb login && wandb sync RUN_DIR/wandb/offline-run-* && python -m asyncrl.analysis.dashboard --project asyncrl",
            file=sys.stderr,
        )
        return 1
    import wandb

    entity = args.entity or wandb.Api().default_entity
    saved = build_workspace(entity, args.project, args.name).save()
    print(f"asyncrl.analysis.dashboard: workspace saved: {getattr(saved, 'url', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
