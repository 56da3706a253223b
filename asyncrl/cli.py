"""The `asyncrl` command: ``asyncrl run | inspect | plot | export ...``, each the module of the same name.

``asyncrl run --help`` lists every config key; ``asyncrl <command> --help`` the options of the others.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module

import asyncrl

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("asyncrl.run", "train: --config FILE, --resume RUN_DIR, --print-config, section.key=value overrides"),
    "inspect": ("asyncrl.inspect", "see inside a run directory: samples by status, lengths, reward by version, bottleneck"),
    "plot": ("asyncrl.plot", "plot a run directory's metrics to PNG"),
    "export": ("asyncrl.export", "write a Hugging Face model directory (and a LoRA adapter) from a run's checkpoint"),
    "scale": ("asyncrl.scale", "resize a running job's rollout pool: RUN N (none: print the pool's state)"),
    "stop": ("asyncrl.stop", "end a running job after the step under way: weights published, checkpoint, evaluation, summary"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items())
    return f"usage: asyncrl <command> [args ...]\n\ncommands:\n{rows}\n\n`asyncrl <command> --help` for each; `asyncrl --version`."


def command(name: str) -> Callable[..., int]:
    """The `main(argv)` of a command's module (imported only when that command runs)."""
    return import_module(COMMANDS[name][0]).main


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"asyncrl {asyncrl.__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"asyncrl: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if name == "run":
        return command(name)(rest, prog="asyncrl run")
    return command(name)(rest)


if __name__ == "__main__":
    sys.exit(main())
