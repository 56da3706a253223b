"""Entry point: ``asyncrl run --config configs/default.yaml key=value ...`` (or ``python -m asyncrl.run ...``).

``python -m asyncrl.run --resume RUN_DIR [key=value ...]`` continues that run
from its latest checkpoint, with the config it was started with (overrides
apply on top, e.g. ``run.steps=200`` to train longer).

``--print-config`` prints the resolved config (defaults, file and overrides) as YAML and exits; ``--help``
lists every config key with its type, default and meaning.

Exit status 2, with one line naming the key, for any config problem, before
Ray or an engine starts.
"""
from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path

import yaml

from asyncrl.core.config import ConfigError, KeyDoc, config_keys, load_config


def keys_help(keys: list[KeyDoc], width: int = 100) -> str:
    """Every config key for --help: a heading per section, then `key (type, default value)` and its doc, indented."""
    lines, section = ["config keys (give them as section.key=value, or nested the same way in the --config YAML):"], ""
    for k in keys:
        if k.key.split(".")[0] != section:
            section = k.key.split(".")[0]
            lines += ["", f"{section}:"]
        lines.append(f"  {k.key} ({k.type}, default {k.default!r})")
        lines += textwrap.wrap(k.doc, width, initial_indent=" " * 6, subsequent_indent=" " * 6) if k.doc else []
    return "\n".join(lines)


def parse_args(argv: list[str] | None, prog: str = "python -m asyncrl.run") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="Train a policy: --config FILE and section.key=value overrides, or --resume RUN_DIR.", epilog=keys_help(config_keys()),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config (defaults apply to keys it omits)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue this run directory from its latest checkpoint")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit (nothing starts)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-5 run.steps=20")
    return parser.parse_args(argv)


def summary_table(summary: dict, run_dir: str) -> str:
    samples = summary["samples"]
    rows = [
        ("steps", summary["steps"]),
        ("wall seconds", f"{summary['wall_s']:.1f}"),
        ("policy version", summary["policy_version"]),
        ("eval accuracy before", f"{summary['eval/accuracy_before']:.3f}"),
        ("eval accuracy after", f"{summary['eval/accuracy_after']:.3f}"),
        ("samples consumed", samples["consumed"]),
        ("samples dropped stale", samples["dropped_stale"]),
        ("samples dropped error", samples["dropped_error"]),
        ("samples unconsumed / aborted", f"{samples['unconsumed']} / {samples['aborted']}"),
    ]
    if not math.isnan(summary["eval/accuracy_after"] - summary["eval/accuracy_before"]):
        rows.insert(5, ("accuracy gain", gain_text(summary)))
    rows.append(("run directory", run_dir))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def gain_text(summary: dict) -> str:
    """'+0.130 (3.2 paired SE; 47 gained, 21 lost of 200)': the held-out gain and how far it is from noise."""
    gain = summary["eval/accuracy_after"] - summary["eval/accuracy_before"]
    if "eval/gain_paired_se" not in summary:  # a summary written before the paired counts were kept
        return f"{gain:+.3f}"
    se, n = summary["eval/gain_paired_se"], summary["eval/problems"]
    z = f"{gain / se:.1f} paired SE" if se > 0 else "no problem changed"
    return f"{gain:+.3f} ({z}; {summary['eval/gained']} gained, {summary['eval/lost']} lost of {n})"


def main(argv: list[str] | None = None, prog: str = "python -m asyncrl.run") -> int:
    args = parse_args(argv, prog)
    try:
        if args.resume:
            if args.config:
                raise ConfigError("--resume", "takes the run's own config.yaml; give changes as overrides, not --config")
            config_path = Path(args.resume) / "config.yaml"
            if not config_path.is_file():
                raise ConfigError("--resume", f"{args.resume} is not a run directory (no config.yaml)")
            cfg = load_config(config_path, [*args.overrides, f"run.output_dir={args.resume}"])
        else:
            cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"asyncrl: config error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        return 0
    from asyncrl.orchestration.controller import run  # heavy imports only after the config is valid

    try:
        summary = run(cfg, resume=bool(args.resume))
    except ValueError as exc:  # bad model path, task, reward or algorithm: named, no traceback
        print(f"asyncrl: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # the run stopped on a named failure (a worker's error, no data, a pool not placeable)
        print(f"asyncrl: run failed: {exc}", file=sys.stderr)
        return 1
    print("\nasyncrl run summary\n" + summary_table(summary, str(cfg.run.output_dir)))
    verdict = summary["bottleneck"]
    ratios = ", ".join(f"{k} {v:.0%}" for k, v in verdict["ratios"].items())
    print(f"\nbottleneck: {verdict['kind']} ({ratios})" + "".join(f"\n  - {a}" for a in verdict["advice"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
