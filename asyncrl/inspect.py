"""See inside a run: ``python -m asyncrl.inspect RUN_DIR [--json] [--export OUT.jsonl --status consumed ...]``.

Works on a finished run and on one killed mid-way. With multi-turn episodes
(env.name) it also counts their turns and how they ended, and
``--transcript SAMPLE_ID`` prints one episode turn by turn. Prints the samples by
status, the effective-sample rate, the response-length distribution (p50 / p90 /
p99 / max, and how many stopped on EOS or were cut at the limit), reward and
length by policy version, which
learner steps moved kl/ref and reward the most, and the bottleneck verdict.
The numbers come from `asyncrl.analysis.runs`; this module only parses and formats.
Exit status 2, with one line on stderr, when RUN_DIR is not a readable run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from asyncrl.analysis.runs import episode_records, export_jsonl, jsonable, load_run, report, select, transcript
from asyncrl.core.schema import Status

NOT_FINISHED = "not finished (no summary.json): killed, crashed or still running"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m asyncrl.inspect", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (run.output_dir)")
    parser.add_argument("--json", action="store_true", help="print the whole report as one JSON object")
    parser.add_argument("--export", metavar="OUT.jsonl", help="write the selected trajectory records as JSON lines")
    parser.add_argument("--status", action="append", default=[], help="export only these statuses (repeatable or comma list)")
    parser.add_argument("--min-version", type=int, help="export only policy_version_start >= N")
    parser.add_argument("--max-version", type=int, help="export only policy_version_start <= N")
    parser.add_argument("--step", type=int, help="export only samples consumed at learner step N")
    parser.add_argument("--transcript", action="append", default=[], metavar="SAMPLE_ID",
                        help="print this episode as a transcript instead of the report (repeatable)")
    return parser.parse_args(argv)


def _num(x: object, fmt: str = "{:.4f}") -> str:
    return "-" if x is None else fmt.format(x)


def _table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def format_text(rep: dict) -> str:
    """The report as aligned text, one section per question."""
    lines = [*_samples_text(rep), *_lengths_text(rep), *_episodes_text(rep), *_versions_text(rep), *_drift_text(rep)]
    lines += ["", "bottleneck", *("  " + line for line in rep["bottleneck"].splitlines())]
    if "export" in rep:
        lines += ["", f"exported {rep['export']['records']} records to {rep['export']['path']}"]
    return "\n".join(lines)


def _samples_text(rep: dict) -> list[str]:
    """The run's state, its samples by status, the effective-sample rate and the rollout cost."""
    pv, samples = rep["policy_versions"], rep["samples"]
    sampled = "none recorded" if pv["sampled_min"] is None else f"{pv['sampled_min']}..{pv['sampled_max']}"
    lines = [
        f"run dir          {rep['run_dir']}",
        f"state            {'finished (summary.json)' if rep['finished'] else NOT_FINISHED}",
        f"steps logged     {rep['steps_logged']}",
        f"policy versions  last published {_num(pv['last_published'], '{}')}; samples started at {sampled}",
        "",
        "samples by status",
    ]
    counts = samples["by_status"]
    width = max(len(k) for k in counts)
    lines += [f"  {k:<{width}}  {v:>7}" for k, v in counts.items()]
    lines.append(f"  {'total generated':<{width}}  {samples['total']:>7}")
    if samples["total"]:
        lines.append(
            f"effective-sample rate  {samples['effective_rate']:.3f} "
            f"({counts[Status.CONSUMED.value]} consumed / {samples['total']} recorded)"
        )
    else:
        why = "" if rep["finished"] else ": no trajectory part flushed yet, the store writes one per 512 samples"
        lines.append(f"effective-sample rate  n/a (0 samples recorded{why})")
    cost = rep["rollout_cost"]
    if not rep["finished"]:
        lines.append("rollout cost           n/a (run not finished: samples generated but not yet flushed are missing)")
    elif cost is None:
        lines.append("rollout cost           n/a (no consumed samples recorded)")
    else:
        lines.append(
            f"rollout cost           {cost['per_1000_effective']:.1f} worker-s per 1000 effective samples "
            f"({cost['worker_seconds']:.1f} s over {cost['workers']} worker(s), first submission to last generation)"
        )
    return lines


def _lengths_text(rep: dict) -> list[str]:
    lengths = rep["response_lengths"]
    lines = ["", "response lengths (tokens, every generated sample)"]
    if lengths is None:
        lines.append("  no generated samples recorded")
    else:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(lengths["finish_reasons"].items()))
        lines.append(f"  mean {lengths['mean']:.1f}  p50 {lengths['p50']}  p90 {lengths['p90']}  p99 {lengths['p99']}  max {lengths['max']}"
                     f"  (finish: {reasons})")
    return lines


def _episodes_text(rep: dict) -> list[str]:
    """Multi-turn episodes' turns and ends; nothing without them."""
    eps = rep.get("episodes")
    if not eps:
        return []
    ends = ", ".join(f"{k} {v}" for k, v in eps["ends"].items())
    lines = ["", "episodes (env.name)",
             f"  {eps['episodes']} episodes, model turns p50 {eps['turns_p50']} max {eps['turns_max']}, {eps['tool_calls']} tool calls",
             f"  ended: {ends}"]
    if eps["examples"]:
        lines.append(f"  read one: python -m asyncrl.inspect {rep['run_dir']} --transcript {eps['examples'][0]}")
    return lines


def _versions_text(rep: dict) -> list[str]:
    lines = ["", "reward / response length by policy version (consumed samples; kl/ref of the steps trained at it)"]
    if rep["by_version"]:
        rows = [
            [str(r["policy_version"]), str(r["samples"]), _num(r["reward_mean"]), _num(r["reward_std"]),
             _num(r["response_len_mean"], "{:.2f}"), _num(r["kl_ref_mean"], "{:.5f}")]
            for r in rep["by_version"]
        ]
        lines += _table(["version", "samples", "reward_mean", "reward_std", "resp_len", "kl/ref"], rows)
    else:
        lines.append("  no consumed samples recorded")
    return lines


def _drift_text(rep: dict) -> list[str]:
    lines = ["", "drift attribution (delta = row[t+1] - row[t], credited to step t's batch)"]
    for key, moves in rep["drift"].items():
        lines.append(f"  {key}")
        if not moves:
            lines.append("    fewer than two logged steps with it")
            continue
        rows = [
            [str(m["step"]), f"{m['delta']:+.5f}", _num(m["reward_mean"]), _num(m["reward_std"]),
             _num(m["staleness_mean"], "{:.2f}"), _num(m["is_ratio_max"], "{:.3f}"), str(m["consumed_samples"])]
            for m in moves
        ]
        lines += _table(["step", "delta", "reward_mean", "reward_std", "staleness", "is_ratio_max", "consumed"], rows, "    ")
    return lines


def _statuses(values: list[str]) -> list[str]:
    """--status values, comma lists split; ValueError naming an unknown one."""
    out = [s.strip() for v in values for s in v.split(",") if s.strip()]
    known = {s.value for s in Status}
    unknown = [s for s in out if s not in known]
    if unknown:
        raise ValueError(f"unknown --status {', '.join(unknown)} (one of {', '.join(sorted(known))})")
    return out


def _print_transcripts(table, sample_ids: list[str]) -> int:
    print("\n\n".join(transcript(r) for r in episode_records(table, sample_ids)), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        statuses = _statuses(args.status)
        filters = statuses or any(v is not None for v in (args.min_version, args.max_version, args.step))
        if filters and not args.export:
            raise ValueError("--status, --min-version, --max-version and --step select what --export writes; add --export OUT.jsonl")
        run = load_run(args.run_dir)
        if args.transcript:
            return _print_transcripts(run.trajectories, args.transcript)
        rep = report(run)
        if args.export:
            chosen = select(run.trajectories, statuses, args.min_version, args.max_version, args.step)
            rep["export"] = {"path": args.export, "records": export_jsonl(chosen, args.export)}
    except (OSError, ValueError) as exc:  # missing dir, not a run dir, unreadable part, unknown schema version
        print(f"asyncrl.inspect: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(jsonable(rep), indent=2) if args.json else format_text(rep), flush=True)
    except BrokenPipeError:  # piped into `head`: stop quietly (the Python docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
