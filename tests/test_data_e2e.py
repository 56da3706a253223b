"""End-to-end: a run trains from a Parquet train file and a separate JSONL val file, scored by a reward in a Python
file (task.reward: file.py:fn) that reads an extra column of each record (slow: local Ray, vLLM, the tiny model)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from asyncrl.core.store import read_trajectories

ROOT = Path(__file__).resolve().parents[1]
REWARD = '''
def weighted(prompt, response):
    """Exact match, worth the record's own `weight` column (0.5 in every record: a reward of 1.0 would mean the
    column never reached it)."""
    return prompt.record["weight"] * float(response.strip() == prompt.answer)
'''


def addition_records(n: int, seed: int) -> list[dict]:
    """2-digit "a+b=" prompts (all the tiny model reads), their sums, and an extra column."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(100), rng.randrange(100)) for _ in range(n)]
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b), "weight": 0.5} for a, b in pairs]


@pytest.mark.slow
def test_a_run_trains_from_a_parquet_file_and_a_val_file_with_a_reward_file(tiny_model_dir, tmp_path):
    pq.write_table(pa.Table.from_pylist(addition_records(200, 0)), tmp_path / "train.parquet")
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in addition_records(20, 1)))
    (tmp_path / "weighted_reward.py").write_text(REWARD)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "asyncrl.run", "--config", "configs/smoke.yaml", f"run.output_dir={out}", f"model.path={tiny_model_dir}",
           "run.steps=2", "task.name=dataset", f"data.train={tmp_path}/train.parquet", f"data.val={tmp_path}/val.jsonl",
           f"data.cache_dir={tmp_path}/hf_cache", f"task.reward={tmp_path}/weighted_reward.py:weighted", "task.eval_size=20"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    rows = read_trajectories(out / "trajectories").to_pylist()
    trained = [r for r in rows if r["status"] == "consumed"]
    assert len(trained) == 2 * 16
    assert {r["reward"] for r in trained} <= {0.0, 0.5} and any(r["reward"] == 0.5 for r in trained)  # the column reached it
    assert {r["prompt_text"] for r in trained} <= {rec["prompt"] for rec in addition_records(200, 0)}  # train prompts only
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 < summary["eval/accuracy_after"] <= 0.5  # the val file, scored by the same reward
    assert yaml.safe_load((out / "config.yaml").read_text())["task"]["reward"] == f"{tmp_path}/weighted_reward.py:weighted"
