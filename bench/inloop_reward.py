"""What the rollout loop pays for scoring in a killable process, with a fast reward.

    .venv/bin/python bench/inloop_reward.py --config configs/default.yaml --groups 300

Without a reward pool the loop hands each finished group to its reward thread, which scores it in the worker's
reward process (asyncrl.core.scoring.ScoringProcess: a call past task.reward_timeout_s is killed), and takes it back
scored at its next check. On the config's own task and reward, over `--groups` groups of group_size responses after
one warm-up group: the loop thread's time per group (hand-off and delivery), the time calling the reward in the
loop's thread would take instead (no protection), and the reward process's wall time per group (off the loop).
Then a short run of the config (the same invocation, the same machine) gives the loop's busy time per group
generated, `rollout/busy_s_total` over the groups; the share is the loop thread's scoring time over that. Writes bench/results/inloop_reward_<config>.{json,md};
exits non-zero on an impossible figure (a time that is not positive, a share above 1).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from results_io import QUIET, ROOT, provenance, publish, run_asyncrl


def scoring_costs(cfg, groups: int) -> dict:
    """Seconds per group on the loop's thread: handing a group to the in-loop scoring (asyncrl.actors.rollout.scoring.
    InLoopScoring over the worker's reward process) and taking it back scored, against calling the reward in the
    loop's thread; and the reward process's own time per group (its thread, off the loop)."""
    sys.path.insert(0, str(ROOT))
    from types import SimpleNamespace

    from asyncrl.actors.reward import reward_options
    from asyncrl.actors.rollout.scoring import FailureStreak, InLoopScoring
    from asyncrl.core.messages import WorkerCounters
    from asyncrl.core.reward_traits import per_sample
    from asyncrl.core.rewards import make_reward
    from asyncrl.core.scoring import ScoringProcess
    from asyncrl.core.tasks import make_task

    stream = make_task(cfg.task, cfg.run.seed, cfg.data).train_prompts(seed=0, start=0)
    batch = [next(stream) for _ in range(groups + 1)]
    n = cfg.rollout.group_size
    responses = [[f"{p.answer} " if i % 2 else f"{i}" for i in range(n)] for p in batch]  # half right, as a run has
    delivered: list[list[dict]] = []
    scoring = InLoopScoring(ScoringProcess(cfg.task.reward, reward_options(cfg), cfg.task.reward_timeout_s), delivered.append,
                            FailureStreak(10**9, cfg.task.reward, print), WorkerCounters())
    direct = per_sample(make_reward(cfg.task.reward))

    def hand(i: int) -> None:
        scoring.hand_off(SimpleNamespace(prompt=batch[i]), [{"response_text": r} for r in responses[i]])

    hand(0)  # the reward process starts once per worker: not a group's cost
    while len(scoring):
        scoring.check()
    loop_s, t_start = 0.0, time.perf_counter()
    for i in range(1, groups + 1):  # as the loop does: hand a group over, check now and then
        t0 = time.perf_counter()
        hand(i)
        scoring.check()
        loop_s += time.perf_counter() - t0
    while len(scoring):
        t0 = time.perf_counter()
        scoring.check()
        loop_s += time.perf_counter() - t0
        time.sleep(0.001)
    scored_s = time.perf_counter() - t_start
    t0 = time.perf_counter()
    want = [[direct(p, r) for r in rs] for p, rs in zip(batch[1:], responses[1:])]
    thread_s = time.perf_counter() - t0
    if [[r["reward"] for r in g] for g in delivered[1:]] != want:
        raise ValueError("the reward process's rewards differ from the reward's own")
    scoring.scorer.close()
    return {"loop_side_s": loop_s / groups, "thread_s": thread_s / groups, "process_wall_s": scored_s / groups,
            "groups": groups, "group_size": n}


def loop_time_per_group(config: Path, steps: int) -> dict:
    run_dir = Path("bench") / "work" / f"inloop_reward_{config.stem}"
    shutil.rmtree(ROOT / run_dir, ignore_errors=True)
    run_asyncrl(config, [*QUIET, f"run.steps={steps}", f"run.output_dir={run_dir}"])
    last = [json.loads(line) for line in (ROOT / run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()][-1]
    summary = json.loads((ROOT / run_dir / "summary.json").read_text())
    groups = sum(w["groups_done"] for w in summary["rollout"])
    return {"busy_s": last["rollout/busy_s_total"], "groups_generated": groups, "loop_s_per_group": last["rollout/busy_s_total"] / groups}


def render(r: dict) -> str:
    return "\n".join([
        f"Scoring groups of {r['group_size']} with `{r['reward']}` (`{r['config']}`) in the worker's reward process, "
        f"{r['groups']} groups, against the loop's busy time per group in a {r['steps']}-step run of the same config:", "",
        "| loop's thread per group: hand-off and delivery | the reward called in the loop's thread instead | reward process, wall per group | loop time per group | loop's share |",
        "|---|---|---|---|---|",
        f"| {1000 * r['loop_side_s']:.3f} ms | {1000 * r['thread_s']:.3f} ms | {1000 * r['process_wall_s']:.2f} ms | "
        f"{1000 * r['loop_s_per_group']:.0f} ms | {r['share']:.4f} |", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    start = provenance(sys.argv[1:])
    sys.path.insert(0, str(ROOT))
    from asyncrl.core.config import load_config

    cfg = load_config(str(ROOT / args.config), [])
    result = {"config": str(args.config), "reward": cfg.task.reward, "steps": args.steps, **scoring_costs(cfg, args.groups),
              **loop_time_per_group(args.config, args.steps)}
    result["share"] = result["loop_side_s"] / result["loop_s_per_group"]
    if min(result["loop_side_s"], result["thread_s"], result["loop_s_per_group"]) <= 0 or result["share"] > 1:
        raise SystemExit(f"impossible figures: {result}")
    publish(args.out, f"inloop_reward_{args.config.stem}", "inloop_reward", result, sys.argv[1:], start)


if __name__ == "__main__":
    main()
