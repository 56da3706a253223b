"""bench/shared_prompt.py's pure parts: the bound a measured speedup cannot pass, and its table."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from shared_prompt import position_bound, render  # noqa: E402


def test_the_bound_is_the_ratio_of_positions_the_passes_compute():
    # 4 micro-batches of 4 rows of 525 tokens, against 4 x (469 prompt positions once + 4 x 56)
    assert position_bound(16, 8, 4, 470, 55) == pytest.approx(8400 / 2772)
    assert position_bound(16, 8, 4, 20, 55) == 1.0  # a prompt below SHARED_PREFIX_MIN is not shared: no saving
    assert position_bound(16, 8, 1, 470, 55) == 1.0  # one row a micro-batch: nothing to share


def test_the_table_gives_each_run_the_speedup_and_its_bound():
    data = {"config": "configs/c.yaml", "prompt": 470, "response": 55, "steps": 2, "repeats": 2, "batch": 16, "group_size": 8,
            "micro_batch": 4, "runs_s": {"on": [80.0, 90.0], "off": [180.0, 200.0]}, "median_s": {"on": 85.0, "off": 190.0}, "bound": 3.03}
    text = render(data)
    assert "| off | 190.0 | 180.0, 200.0 |" in text and "**2.24x** | 3.03x |" in text and "median of the step after the first" in text
