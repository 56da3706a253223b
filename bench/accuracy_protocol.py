"""Time to accuracy, tuned fairly and reported on held-out problems: asyncrl, its synchronous baseline and TRL.

    .venv/bin/python bench/accuracy_protocol.py            # every step not yet recorded, in order (about 20 h on 2 cores)
    .venv/bin/python bench/accuracy_protocol.py dev         # one step: dev | choose | test | summary

Each step is `bench/vs_trl.py` runs (or reads their records), and every run is recorded in bench/results/ as it ends,
so the protocol can be stopped and resumed: a step whose record exists is not run again, and a run stopped part-way
goes on from the sides it had finished. Each side runs and is scored on its own; once scored it is copied to
bench/results/sides/<run>/<side>.json (commit it: a machine's bench/work/ does not outlast it), so a protocol spread
over sessions on fresh machines loses at most the side it was running. `--sides asyncrl,sync` runs only those sides
now (a session too short for TRL's); a run's record is written once its three sides are in the ledger. A test run's
sides all run on one kind of machine (core count and CPU model): a seed started on another kind waits for a session
on that kind, and the next seed runs instead.

1. dev: for each learning rate of `LRS`, one run of the three sides back to back on the config's training stream,
   evaluated on the dev problems (`task.dev_size`): asyncrl (`--config`), its colocated synchronous baseline
   (`--sync-config`) and TRL's GRPOTrainer with vLLM colocated, batching as its docs recommend (`--trl-config`,
   the synchronous baseline's generation of 64 and 4 updates).
2. choose: each side's learning rate is the one with the highest dev accuracy at the last step; the threshold is
   the highest dev accuracy every side reaches at its chosen rate, rounded down to 0.01, and must lie above the
   untrained model's (else the step stops and says which side never passed it). Recorded (a table of its
   own) before any test run, which reads it.
3. test: `SEEDS` runs of the three sides at their chosen rates, evaluated on the test problems (`task.eval_size`,
   never read by steps 1-2), time to the chosen threshold.
4. summary: `bench/vs_trl_seeds.py`: per side the median (range) over seeds of the time to the threshold and of
   trained samples/s, asyncrl's speedups.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

from results_io import provenance, publish, shown  # bench/ is on sys.path when a benchmark runs as a script
from vs_trl import SIDE_NAMES, final_accuracy, machine, machine_kind

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LRS = ("2.5e-4", "5e-4", "1e-3")
SEEDS = (0, 1, 2)
SIDES = ("asyncrl", "sync", "trl_vllm")  # vs_trl.py's keys of the three sides


# ----------------------------------------------------------------------------- pure logic (tested)
def best_accuracy(side: dict) -> float:
    """The highest accuracy any of a side's snapshots reached."""
    return max(p["accuracy"] for p in side["points"])


def choose(dev: dict[str, dict], sides: tuple[str, ...] = SIDES) -> dict:
    """From the dev runs {learning rate: vs_trl result}: each side's rate (the highest final dev accuracy; a tie
    goes to the smaller rate) and the threshold (the highest accuracy every side reaches at its rate, rounded down
    to 0.01)."""
    if not dev:
        raise ValueError("no dev runs to choose from")
    for lr, result in dev.items():
        if result.get("split") != "dev":
            raise ValueError(f"the run at lr {lr} was evaluated on {result.get('split')!r} problems, not dev")
        missing = [s for s in sides if s not in result]
        if missing:
            raise ValueError(f"the run at lr {lr} lacks the sides {missing}")
    chosen = {s: min(dev, key=lambda lr: (-final_accuracy(dev[lr][s]), float(lr))) for s in sides}
    reached = {s: best_accuracy(dev[chosen[s]][s]) for s in sides}
    threshold = math.floor(min(reached.values()) * 100 + 1e-9) / 100
    start = max(p["accuracy"] for lr in dev for s in sides for p in dev[lr][s]["points"] if p["step"] == 0)
    if threshold <= start:  # every side is there before training: a time to it would be 0 for all
        stuck = [s for s in sides if reached[s] <= start]
        raise ValueError(f"no threshold above the untrained model's dev accuracy ({start:.3f}): {stuck} never passed it at "
                         f"any rate (their best: {', '.join(f'{s} {reached[s]:.3f}' for s in stuck)}); more steps or other rates are needed")
    return {"lr": chosen, "threshold": threshold, "reached": reached,
            "final": {lr: {s: final_accuracy(dev[lr][s]) for s in sides} for lr in dev}}


def dev_args(config: str, sync_config: str, lr: str, steps: int, every: int, dev_size: int) -> list[str]:
    return [*common_args(config, sync_config, steps, every, dev_size), "--split", "dev", "--set", f"learner.lr={lr}",
            "--set", "run.eval=false",  # asyncrl's own evaluation reads the test problems: not in the dev phase
            "--threshold", "0.0", "--tag", f"dev-lr{lr}"]


def test_args(config: str, sync_config: str, choice: dict, seed: int, steps: int, every: int, dev_size: int) -> list[str]:
    lr = choice["lr"]
    return [*common_args(config, sync_config, steps, every, dev_size), "--split", "test", "--set", f"run.seed={seed}",
            "--set", f"learner.lr={lr['asyncrl']}", "--sync-set", f"learner.lr={lr['sync']}", "--trl-set", f"learner.lr={lr['trl_vllm']}",
            "--threshold", f"{choice['threshold']:.2f}", "--tag", f"test-s{seed}"]


def common_args(config: str, sync_config: str, steps: int, every: int, dev_size: int) -> list[str]:
    """Both phases train on one stream: the dev problems are held out of it in the test runs too. float32 on every
    side and machine: `model.dtype=auto` is bfloat16 on CPUs with native bf16 and float32 on the others, and the
    protocol's sides run on whichever machine each session gets (TRL's side runs in float32 only)."""
    return ["--config", config, "--sync-config", sync_config, "--trl-config", sync_config, "--vllm-only",
            "--steps", str(steps), "--save-every", str(every), "--set", f"task.dev_size={dev_size}",
            "--set", "model.dtype=float32"]


def render(data: dict) -> str:
    """The choice's table: final dev accuracy per rate and side, the chosen rates and the threshold."""
    names = {"asyncrl": "asyncrl", **SIDE_NAMES}
    sides = list(data["lr"])
    lines = [f"`{Path(data['config']).name}`: dev accuracy (the {data['dev_size']} dev problems, greedy) at the last of "
             f"{data['steps']} steps, per learning rate; **bold**: the rate each side keeps", "",
             f"| learning rate | {' | '.join(names[s] for s in sides)} |", "|---|" + "---|" * len(sides)]
    for lr in sorted(data["final"], key=float):
        cells = [f"**{data['final'][lr][s]:.3f}**" if data["lr"][s] == lr else f"{data['final'][lr][s]:.3f}" for s in sides]
        lines.append(f"| {lr} | {' | '.join(cells)} |")
    lines += ["", "Highest dev accuracy each side reached at its rate: "
              + ", ".join(f"{names[s]} {data['reached'][s]:.3f}" for s in sides)
              + f". Threshold for the test runs (the lowest of these, rounded down): **{data['threshold']:.2f}**."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the steps
def record(name: str) -> Path:
    return BENCH / "results" / f"{name}.json"


WORK = BENCH / "work"
"""Where each run's sides are kept until its record is written (git ignores it): a run stopped part-way (a session
that ends) goes on from its last finished side, or its last scored side, when the protocol is started again."""


LEDGER = BENCH / "results" / "sides"
"""Each finished side, once scored, as `vs_trl.py --ledger` copies it (git keeps it; commit it as it lands): a
machine's run directories do not outlast it, so a protocol spread over sessions goes on from these."""


def vs_trl_commands(args: list[str], sides: tuple[str, ...]) -> tuple[list[list[str]], Path]:
    """One run's vs_trl invocations: each side of `sides` alone (run, or taken from the ledger, and scored), then,
    once the ledger holds all of SIDES, the one that reports them; and where that record will be."""
    tag = args[args.index("--tag") + 1]
    stem = Path(args[args.index("--config") + 1]).stem
    base = [sys.executable, str(BENCH / "vs_trl.py"), *args, "--keep", shown(WORK / f"{stem}_{tag}"), "--resume",
            "--ledger", shown(LEDGER / f"{stem}_{tag}")]
    cmds = [[*base, "--only", side] for side in sides]
    if set(SIDES) <= set(sides) | ledgered(LEDGER / f"{stem}_{tag}"):
        cmds.append(base)
    return cmds, record(f"vs_trl_{stem}_{tag}")


def unrecorded_seeds(stem: str) -> list[int]:
    """The test seeds whose run has no record yet (some of its sides may be in the ledger)."""
    return [seed for seed in SEEDS if not record(f"vs_trl_{stem}_test-s{seed}").is_file()]


def ledgered(ledger: Path) -> set[str]:
    """The sides a run's ledger holds, scored."""
    return {p.stem for p in ledger.glob("*.json") if json.loads(p.read_text()).get("scored")}


def elsewhere(ledger: Path, here: dict) -> dict[str, str]:
    """The sides of a run in `ledger` that ran on another kind of machine than `here`: {side: its kind}. A test
    run's clocks are compared, so its sides must share one kind of machine."""
    out = {}
    for p in sorted(ledger.glob("*.json")):
        m = json.loads(p.read_text()).get("machine")
        if m and machine_kind(m) != machine_kind(here):
            out[p.stem] = machine_kind(m)
    return out


def run_vs_trl(args: list[str], sides: tuple[str, ...] = SIDES) -> bool:
    """Run one run's sides of `sides`; True when its record is written (every side of SIDES is in the ledger)."""
    cmds, rec = vs_trl_commands(args, sides)
    for cmd in cmds:
        print("accuracy_protocol: " + " ".join(cmd[1:]), flush=True)
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise SystemExit("accuracy_protocol: a vs_trl run failed; the sides recorded so far stay, rerun to go on")
    return rec.is_file()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", nargs="?", choices=("all", "dev", "choose", "test", "summary"), default="all")
    parser.add_argument("--config", default="configs/smollm2_word_problems.yaml")
    parser.add_argument("--sync-config", default="configs/smollm2_word_problems_sync.yaml")
    parser.add_argument("--steps", type=int, default=64, help="asyncrl learner steps per side (the others train as many samples)")
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--dev-size", type=int, default=200)
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="the sides to run now, comma-separated (a session too short for a whole run runs some; "
                             "a run's record is written once the ledger holds all three)")
    args = parser.parse_args()
    sides = tuple(s for s in args.sides.split(",") if s)
    if not sides or set(sides) - set(SIDES):
        parser.error(f"--sides {args.sides}: give some of {', '.join(SIDES)}")
    stem = Path(args.config).stem
    choice_name = f"accuracy_protocol_{stem}_choice"
    steps = ["dev", "choose", "test", "summary"] if args.step == "all" else [args.step]
    if "dev" in steps:
        for lr in LRS:
            if not record(f"vs_trl_{stem}_dev-lr{lr}").is_file():
                run_vs_trl(dev_args(args.config, args.sync_config, lr, args.steps, args.save_every, args.dev_size), sides)
        if any(not record(f"vs_trl_{stem}_dev-lr{lr}").is_file() for lr in LRS):
            raise SystemExit("accuracy_protocol: the dev runs lack sides (see bench/results/sides/); run dev with the others")
    if "choose" in steps and not record(choice_name).is_file():
        start = provenance(sys.argv[1:])
        dev = {lr: json.loads(record(f"vs_trl_{stem}_dev-lr{lr}").read_text())["result"] for lr in LRS}
        try:
            data = choose(dev)
        except ValueError as exc:
            raise SystemExit(f"accuracy_protocol: {exc}")
        data.update(config=args.config, steps=args.steps, dev_size=args.dev_size,
                    records=[shown(record(f"vs_trl_{stem}_dev-lr{lr}")) for lr in LRS])
        publish(BENCH / "results", choice_name, "accuracy_protocol", data, sys.argv[1:], start)
    if "test" in steps:
        choice = json.loads(record(choice_name).read_text())["result"]
        here = machine()
        for seed in SEEDS:
            if record(f"vs_trl_{stem}_test-s{seed}").is_file():
                continue
            other = elsewhere(LEDGER / f"{stem}_test-s{seed}", here)
            if other:  # its clocks would not compare: left for a session on that kind of machine
                print(f"accuracy_protocol: test seed {seed} is left for another session: its sides "
                      f"{', '.join(f'{k} ran on {v}' for k, v in other.items())}; this machine has {machine_kind(here)}", flush=True)
                continue
            run_vs_trl(test_args(args.config, args.sync_config, choice, seed, args.steps, args.save_every, args.dev_size), sides)
        if unrecorded_seeds(stem):
            raise SystemExit("accuracy_protocol: the test runs lack sides (see bench/results/sides/); run test with the others")
    if "summary" in steps:
        missing = unrecorded_seeds(stem)
        if missing:
            raise SystemExit(f"accuracy_protocol: no summary yet: test seed(s) {', '.join(map(str, missing))} not recorded "
                             "(bench/results/sides/ holds their finished sides); run the test step first")
        tests = [shown(record(f"vs_trl_{stem}_test-s{seed}")) for seed in SEEDS]
        cmd = [sys.executable, str(BENCH / "vs_trl_seeds.py"), "--name", f"{stem}_test", *tests]
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise SystemExit("accuracy_protocol: the summary failed")


if __name__ == "__main__":
    main()
