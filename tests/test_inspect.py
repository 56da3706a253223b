"""`python -m asyncrl.inspect` and the analysis functions under it.

Fast: the pure functions on hand-built tables, the committed schema-v1 mini run
(tests/fixtures/run_v1, made once by tests/fixtures/make_run_v1.py; every
expected number below is worked out by hand there), the CLI on it, and a
killed copy of it. Slow: a real smoke run killed with SIGKILL mid-way.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from asyncrl.analysis.runs import (
    by_version,
    drift_attribution,
    effective_sample_rate,
    eval_summary,
    export_jsonl,
    load_run,
    paired_gain,
    report,
    response_lengths,
    rollout_cost,
    select,
    status_counts,
    trained_versions,
)
from asyncrl.core.schema import SAMPLE_SCHEMA, SCHEMA_VERSION, new_sample
from asyncrl.core.store import read_trajectories

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/run_v1"
ALL_STATUSES = ["consumed", "dropped_stale", "filtered", "dropped_error", "unconsumed_at_end", "aborted_at_end"]


def table(*rows: dict) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SAMPLE_SCHEMA)


def sample(status: str = "consumed", version: int = 0, reward: float | None = 1.0, n: int = 2, step: int | None = 0, **kw) -> dict:
    values = {"status": status, "policy_version_start": version, "reward": reward, "response_ids": list(range(n)),
              "consumed_step": step if status == "consumed" else None, "worker_id": 0, "run_id": "r", **kw}
    return new_sample(**values)


def inspect_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asyncrl.inspect", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


# ---- pure functions -------------------------------------------------------------------------


def test_response_length_distribution_and_finish_reasons():
    rows = [sample(n=n, finish_reason="stop") for n in (1, 2, 3, 4, 5, 6, 7, 8)] + [sample(n=10, finish_reason="length")]
    rows.append(sample(status="dropped_error", n=0))  # a bad prompt: nothing generated, not a length
    got = response_lengths(table(*rows))
    # lengths 1..8, 10; "lower" quantiles: p50 -> index 4 (5), p90 -> index 7 (8), p99 -> index 7 (8)
    assert got == {"samples": 9, "mean": pytest.approx(46 / 9), "max": 10, "p50": 5, "p90": 8, "p99": 8,
                   "finish_reasons": {"stop": 8, "length": 1}}
    assert response_lengths(table()) is None


def test_status_counts_lists_every_status_and_effective_rate():
    t = table(sample(), sample(), sample("dropped_stale"), sample("aborted_at_end", reward=None))
    assert status_counts(t) == {"consumed": 2, "dropped_stale": 1, "filtered": 0, "dropped_error": 0, "unconsumed_at_end": 0, "aborted_at_end": 1}
    assert effective_sample_rate(t) == 0.5
    empty = SAMPLE_SCHEMA.empty_table()
    assert status_counts(empty) == dict.fromkeys(ALL_STATUSES, 0)
    assert effective_sample_rate(empty) is None


def test_trained_versions_are_one_behind_after_a_sync():
    # sync_every=2: steps 0-1 train at version 0, 2-3 at version 1 (the logged version is post-sync)
    assert trained_versions([{"policy_version": v} for v in (0, 1, 1, 2)]) == [0, 0, 1, 1]
    assert trained_versions([{"policy_version": v} for v in (1, 2, 3)]) == [0, 1, 2]
    assert trained_versions([]) == []


def test_by_version_groups_consumed_samples_only():
    t = table(
        sample(version=0, reward=1.0, n=2), sample(version=0, reward=0.0, n=4), sample(version=0, reward=0.5, n=3),
        sample(version=1, reward=0.25, n=5),
        sample("dropped_stale", version=1, reward=1.0, n=9),  # not consumed: left out
    )
    metrics = [{"policy_version": 1, "kl/ref": 0.0}, {"policy_version": 2, "kl/ref": 0.3}, {"policy_version": 3, "kl/ref": float("nan")}]
    rows = by_version(t, metrics)
    assert [r["policy_version"] for r in rows] == [0, 1]
    v0, v1 = rows
    assert v0["samples"] == 3 and v0["reward_mean"] == pytest.approx(0.5)
    assert v0["reward_std"] == pytest.approx(0.5)  # ddof=1: deviations .5, -.5, 0 -> .5/2 -> sqrt .25
    assert v0["response_len_mean"] == pytest.approx(3.0)
    assert v0["kl_ref_mean"] == 0.0  # the step trained at version 0 (row 0, logged as version 1)
    assert v1 == {"policy_version": 1, "samples": 1, "reward_mean": 0.25, "reward_std": 0.0, "response_len_mean": 5.0, "kl_ref_mean": 0.3}
    assert by_version(SAMPLE_SCHEMA.empty_table(), metrics) == []


def test_drift_attribution_credits_the_step_before_the_jump():
    metrics = [
        {"step": 0, "kl/ref": 0.0, "reward/mean": 0.1, "reward/std": 0.2, "staleness/mean": 0.0, "is_ratio/max": 1.0},
        {"step": 1, "kl/ref": 0.5, "reward/mean": 0.2, "reward/std": 0.3, "staleness/mean": 1.0, "is_ratio/max": 2.0},
        {"step": 2, "kl/ref": 0.4, "reward/mean": 0.9, "reward/std": 0.4, "staleness/mean": 0.5, "is_ratio/max": 3.0},
        {"step": 3, "kl/ref": 0.45, "reward/mean": 0.3},
        {"step": 4},  # no kl/ref (e.g. a torn or partial row): its pair is skipped
    ]
    t = table(sample(step=0), sample(step=0), sample(step=1), sample("dropped_stale"))
    kl = drift_attribution(metrics, t, "kl/ref")
    assert [m["step"] for m in kl] == [0, 1, 2]
    assert kl[0]["delta"] == pytest.approx(0.5) and kl[1]["delta"] == pytest.approx(-0.1) and kl[2]["delta"] == pytest.approx(0.05)
    assert kl[0] | {"delta": 0} == {"step": 0, "key": "kl/ref", "delta": 0, "before": 0.0, "after": 0.5, "reward_mean": 0.1,
                                     "reward_std": 0.2, "staleness_mean": 0.0, "is_ratio_max": 1.0, "consumed_samples": 2}
    assert kl[1]["consumed_samples"] == 1 and kl[2]["consumed_samples"] == 0
    reward = drift_attribution(metrics, t, "reward/mean", top=2)
    assert [(m["step"], round(m["delta"], 6)) for m in reward] == [(1, 0.7), (2, -0.6)]
    assert drift_attribution(metrics[:1], t) == []


def test_rollout_cost_uses_each_workers_window_not_summed_latencies():
    # worker 0 runs two groups concurrently from t=0 to t=10; worker 1 from t=2 to t=6 (scored last at 6)
    t = table(
        sample(worker_id=0, t_submitted=0.0, t_generated=10.0, t_scored=9.0),
        sample(worker_id=0, t_submitted=1.0, t_generated=9.0),
        sample("aborted_at_end", worker_id=0, reward=None, t_submitted=4.0),  # never generated
        sample(worker_id=1, t_submitted=2.0, t_generated=5.0, t_scored=6.0),
    )
    cost = rollout_cost(t)
    assert cost == {"worker_seconds": 14.0, "workers": 2, "consumed": 3, "per_1000_effective": pytest.approx(14000 / 3)}
    assert rollout_cost(SAMPLE_SCHEMA.empty_table()) is None
    assert rollout_cost(table(sample("dropped_stale", t_submitted=0.0, t_generated=1.0))) is None


def test_select_and_export(tmp_path):
    t = table(
        sample(version=0, step=0, sample_id="a"), sample(version=1, step=1, sample_id="b"), sample(version=2, step=1, sample_id="c"),
        sample("dropped_stale", version=0, sample_id="d"), sample("unconsumed_at_end", version=2, sample_id="e"),
    )
    ids = lambda x: x.column("sample_id").to_pylist()  # noqa: E731
    assert ids(select(t)) == ["a", "b", "c", "d", "e"]
    assert ids(select(t, ["consumed"])) == ["a", "b", "c"]
    assert ids(select(t, ["dropped_stale", "unconsumed_at_end"])) == ["d", "e"]
    assert ids(select(t, min_version=1)) == ["b", "c", "e"]
    assert ids(select(t, max_version=0)) == ["a", "d"]
    assert ids(select(t, step=1)) == ["b", "c"]  # samples never consumed have no step: never selected by --step
    assert ids(select(t, ["consumed"], min_version=1, max_version=1, step=1)) == ["b"]
    assert select(SAMPLE_SCHEMA.empty_table(), ["consumed"], 0, 3, 1).num_rows == 0
    out = tmp_path / "x.jsonl"
    assert export_jsonl(select(t, step=1), out) == 2
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["sample_id"] for r in lines] == ["b", "c"] and set(lines[0]) == set(SAMPLE_SCHEMA.names)


# ---- the committed schema-v1 run (guards reading old runs) -------------------------------------


def test_schema_v1_fixture_still_reads():
    t = read_trajectories(FIXTURE / "trajectories")
    assert t.num_rows == 22
    assert set(t.column("schema_version").to_pylist()) == {1} and t.column("token_versions").null_count == t.num_rows  # read with the v2 column, null
    assert set(SAMPLE_SCHEMA.names) <= set(t.schema.names)
    rows = {r["sample_id"]: r for r in t.to_pylist()}
    first = rows["run_v1-abc123-w0-g0-0"]
    assert (first["reward"], first["response_ids"], first["consumed_step"], first["status"]) == (1.0, [10, 11, 12], 0, "consumed")
    assert rows["run_v1-abc123-w0-g5-1"]["t_generated"] is None  # aborted before it finished


def test_schema_v1_fixture_report_numbers():
    rep = report(load_run(FIXTURE))
    assert rep["finished"] and rep["steps_logged"] == 4
    assert rep["policy_versions"] == {"last_published": 4, "sampled_min": 0, "sampled_max": 4}
    assert rep["samples"]["by_status"] == {"consumed": 16, "dropped_stale": 2, "filtered": 0, "dropped_error": 0, "unconsumed_at_end": 2, "aborted_at_end": 2}
    assert rep["samples"]["total"] == 22 and rep["samples"]["effective_rate"] == pytest.approx(16 / 22)
    # worker 0: submitted first at 0, last generation at 10; worker 1: 1 to 9.0 (scored) -> 18 s for 16 consumed
    assert rep["rollout_cost"]["worker_seconds"] == pytest.approx(18.0)
    assert rep["rollout_cost"]["per_1000_effective"] == pytest.approx(1125.0)
    table_ = [(r["policy_version"], r["samples"], r["reward_mean"], r["reward_std"], r["response_len_mean"], r["kl_ref_mean"])
              for r in rep["by_version"]]
    expected = [(0, 6, 1 / 3, math.sqrt(4 / 15), 4.0, 0.0), (1, 4, 0.375, math.sqrt(0.6875 / 3), 5.0, 0.002),
                (2, 4, 0.75, 0.5, 6.0, 0.010), (3, 2, 0.75, math.sqrt(0.125), 7.0, 0.011)]
    assert table_ == [pytest.approx(e) for e in expected]
    kl_moves = [(m["step"], round(m["delta"], 6), m["consumed_samples"]) for m in rep["drift"]["kl/ref"]]
    assert kl_moves == [(1, 0.008, 4), (0, 0.002, 4), (2, 0.001, 4)]
    assert [(m["step"], round(m["delta"], 6)) for m in rep["drift"]["reward/mean"]] == [(2, 0.5), (0, 0.25), (1, -0.125)]
    assert rep["drift"]["kl/ref"][0]["is_ratio_max"] == 1.2 and rep["drift"]["kl/ref"][0]["staleness_mean"] == 0.5
    assert rep["bottleneck_kind"] == "generation-bound"


def test_cli_text_on_the_fixture():
    proc = inspect_cli(str(FIXTURE))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for line in [
        "state            finished (summary.json)",
        "steps logged     4",
        "policy versions  last published 4; samples started at 0..4",
        "  consumed                16",
        "  dropped_error            0",
        "  total generated         22",
        "effective-sample rate  0.727 (16 consumed / 22 recorded)",
        "rollout cost           1125.0 worker-s per 1000 effective samples",
        "        0        6       0.3333      0.5164      4.00  0.00000",
        "       1  +0.00800       0.5000      0.5774       0.50         1.200         4",
        "       2  +0.50000       0.3750      0.4787       0.50         1.500         4",
        "  generation-bound (learner wait 60%, weight sync 2%, rollout idle 10%)",
    ]:
        assert line in out, f"{line!r} not in:\n{out}"
    assert proc.stderr == ""


def test_cli_json_and_export(tmp_path):
    out = tmp_path / "sel.jsonl"
    proc = inspect_cli(str(FIXTURE), "--json", "--export", str(out), "--status", "consumed",
                       "--status", "dropped_stale,unconsumed_at_end", "--min-version", "1", "--max-version", "2")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)  # strict JSON: summary's NaN accuracies must not leak through
    assert rep["samples"]["total"] == 22 and len(rep["by_version"]) == 4
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # consumed at versions 1-2: 4 + 4; the stale group is version 0 and the unconsumed one version 3
    assert len(records) == rep["export"]["records"] == 8
    assert {r["status"] for r in records} == {"consumed"} and {r["policy_version_start"] for r in records} == {1, 2}
    proc = inspect_cli(str(FIXTURE), "--export", str(out), "--step", "3")
    assert proc.returncode == 0 and "exported 4 records" in proc.stdout
    assert {json.loads(line)["consumed_step"] for line in out.read_text().splitlines()} == {3}


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/run"], "no run directory"),
    (["tests"], "not an asyncrl run directory"),
    ([str(FIXTURE), "--export", "/tmp/never.jsonl", "--status", "eaten"], "unknown --status eaten"),
    ([str(FIXTURE), "--step", "1"], "add --export"),
])
def test_cli_errors_are_one_line_exit_2(args, message):
    proc = inspect_cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_cli_on_a_killed_copy(tmp_path):
    run = tmp_path / "killed"
    shutil.copytree(FIXTURE, run)
    (run / "summary.json").unlink()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "policy_version": 5, "kl/r')  # torn last line
    (run / "trajectories" / "part-00001.tmp").write_bytes(b"PAR1 half")  # an unfinished flush is ignored
    proc = inspect_cli(str(run))
    assert proc.returncode == 0, proc.stderr
    assert "not finished (no summary.json): killed, crashed or still running" in proc.stdout
    assert "steps logged     4" in proc.stdout and "  total generated         22" in proc.stdout
    assert "rollout cost           n/a (run not finished" in proc.stdout
    # killed before the first flush: no parts at all, the metrics-based sections still work
    shutil.rmtree(run / "trajectories")
    (run / "trajectories").mkdir()
    proc = inspect_cli(str(run), "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["samples"] == {"by_status": dict.fromkeys(ALL_STATUSES, 0), "total": 0, "effective_rate": None}
    assert rep["by_version"] == [] and rep["rollout_cost"] is None
    assert [m["consumed_samples"] for m in rep["drift"]["kl/ref"]] == [0, 0, 0] and rep["bottleneck_kind"] == "generation-bound"
    assert "0 samples recorded" in inspect_cli(str(run)).stdout


def test_unknown_schema_version_is_a_clear_error(tmp_path):
    run = tmp_path / "future"
    shutil.copytree(FIXTURE, run)
    t = read_trajectories(run / "trajectories")
    future = t.set_column(0, "schema_version", pa.array([SCHEMA_VERSION + 1] * t.num_rows, pa.int32()))
    import pyarrow.parquet as pq

    pq.write_table(future, run / "trajectories" / "part-00000.parquet")
    proc = inspect_cli(str(run))
    assert proc.returncode == 2 and "unsupported" in proc.stderr and "Traceback" not in proc.stderr


# ---- a real run killed mid-way ---------------------------------------------------------------


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (session id, command line) of every live process."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            found[int(proc.name)] = (os.getsid(int(proc.name)), cmd)
        except OSError:
            continue
    return found


RAY_SESSION = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+")


def run_processes(sid: int, sessions: set[str]) -> dict[int, str]:
    """Processes of the run's own session `sid`, plus any naming one of its Ray session dirs (in case one detached)."""
    return {
        pid: cmd for pid, (s, cmd) in processes().items()
        if cmd and (s == sid or any(name in cmd for name in sessions)) and pid != os.getpid()
    }


@pytest.mark.slow
def test_inspect_a_smoke_run_killed_with_sigkill(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={out}", f"model.path={tiny_model_dir}",
           "run.steps=40", "run.eval=false", "logging.wandb=false", "buffer.store_flush_s=0.2"]
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sessions: set[str] = set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = out / "metrics.jsonl"
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        assert len((out / "metrics.jsonl").read_text().splitlines()) >= 3, "the run made no progress in time"
        sessions = set(RAY_SESSION.findall(" ".join(run_processes(proc.pid, set()).values())))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    # Whatever of that run outlives its process group after a grace period is reported, then killed by
    # pid (never `ray stop`: other Ray clusters on this machine are not ours).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and run_processes(proc.pid, sessions):
        time.sleep(0.5)
    leaked = run_processes(proc.pid, sessions)
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not (out / "summary.json").exists()

    res = inspect_cli(str(out))
    assert res.returncode == 0, res.stderr
    assert "not finished (no summary.json): killed, crashed or still running" in res.stdout
    for status in ALL_STATUSES:
        assert f"  {status} " in res.stdout
    rep = json.loads(inspect_cli(str(out), "--json").stdout)
    assert rep["steps_logged"] >= 3 and not rep["finished"]
    parts = sorted((out / "trajectories").glob("part-*.parquet"))
    assert rep["samples"]["total"] == read_trajectories(out / "trajectories").num_rows
    # the store flushes every 0.2 s here, so the killed run left whole parts with samples in them
    assert parts and rep["samples"]["total"] > 0 and rep["samples"]["by_status"]["consumed"] > 0
    print(f"\nkilled run: {rep['steps_logged']} steps logged, {len(parts)} parts, {rep['samples']['total']} samples recorded; "
          f"Ray sessions {sorted(sessions)}; leaked: {sorted(leaked.items()) or 'none'}")
    assert not leaked, f"processes outlived the killed run's process group: {leaked}"


def test_paired_gain_counts_each_problem_and_its_standard_error():
    # 10 problems: 3 gained, 1 lost, 6 unchanged -> differences (1, 1, 1, -1, 0 x 6), mean 0.2
    before = [0, 0, 0, 1, 1, 1, 0, 0, 0, 1]
    after = [1, 1, 1, 0, 1, 1, 0, 0, 0, 1]
    g = paired_gain(before, after)
    assert (g.n, g.gained, g.lost) == (10, 3, 1)
    assert g.before == pytest.approx(0.4) and g.after == pytest.approx(0.6) and g.gain == pytest.approx(0.2)
    # sample variance of the differences: (3 * 0.8^2 + 1.2^2 + 6 * 0.2^2) / 9 = 3.6 / 9, so se = sqrt(0.4 / 10) = 0.2
    assert g.se == pytest.approx(0.2)
    assert paired_gain([1, 0], [1, 0]).se == 0.0
    with pytest.raises(ValueError, match="equally long"):
        paired_gain([1, 0], [1])


def test_eval_summary_and_the_printed_gain():
    from asyncrl.run import gain_text

    summary = eval_summary([0, 0, 0, 1, 1, 1, 0, 0, 0, 1], [1, 1, 1, 0, 1, 1, 0, 0, 0, 1])
    assert summary["eval/problems"] == 10 and summary["eval/gained"] == 3 and summary["eval/lost"] == 1
    se = summary["eval/gain_paired_se"]
    assert gain_text(summary) == f"+0.200 ({0.2 / se:.1f} paired SE; 3 gained, 1 lost of 10)"
    off = eval_summary(None, None)
    assert math.isnan(off["eval/accuracy_before"]) and "eval/gain_paired_se" not in off
    # a summary from before the paired counts: the gain alone
    assert gain_text({"eval/accuracy_before": 0.25, "eval/accuracy_after": 0.5}) == "+0.250"
