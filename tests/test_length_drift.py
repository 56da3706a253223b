"""bench/length_drift.py: the pure parts (no runs), on synthetic trajectory records."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import length_drift  # noqa: E402


def rec(group: str, step: int, reward: float, length: int, finish: str = "stop", status: str = "consumed") -> dict:
    return {"group_id": group, "consumed_step": step, "reward": reward, "response_ids": [0] * length,
            "finish_reason": finish, "status": status}


def test_standardised_rewards_are_grpo_advantages_and_zero_for_equal_rewards():
    assert length_drift.standardised([1.0, 0.0]) == pytest.approx([1.0, -1.0], abs=1e-5)
    assert length_drift.standardised([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]


def test_length_push_is_positive_when_the_better_answers_are_the_longer_ones():
    longer_wins = [rec("a", 0, 1.0, 40), rec("a", 0, 0.0, 10)]
    shorter_wins = [rec("b", 1, 1.0, 10), rec("b", 1, 0.0, 40)]
    assert length_drift.length_push(length_drift.trained_groups(longer_wins), False) == pytest.approx(15.0, rel=1e-4)
    assert length_drift.length_push(length_drift.trained_groups(shorter_wins), False) == pytest.approx(-15.0, rel=1e-4)
    # a group whose rewards are all equal pushes nothing, but its answers count as trained
    flat = [rec("c", 2, 0.0, 100), rec("c", 2, 0.0, 5)]
    assert length_drift.length_push(length_drift.trained_groups(longer_wins + flat), False) == pytest.approx(7.5, rel=1e-4)


def test_masked_cut_answers_leave_the_push_but_keep_their_group_statistics():
    """A wrong answer cut at the cap pushes against length unless masking takes its loss away: then only the
    uncut answers of its group are left, and the push can turn positive."""
    group = [rec("a", 0, 1.0, 30), rec("a", 0, 0.0, 20), rec("a", 0, 0.0, 160, finish="length")]
    groups = length_drift.trained_groups(group)
    assert length_drift.length_push(groups, False) < 0
    adv = length_drift.standardised([1.0, 0.0, 0.0])
    assert length_drift.length_push(groups, True) == pytest.approx((adv[0] * 30 + adv[1] * 20) / 2)
    assert length_drift.length_push(groups, True) > 0


def test_only_consumed_groups_are_trained_and_they_are_ordered_by_step():
    rows = [rec("late", 5, 1.0, 10), rec("dropped", 0, 1.0, 99, status="dropped_stale"), rec("early", 1, 0.0, 10),
            rec("late", 5, 0.0, 20)]
    groups = length_drift.trained_groups(rows)
    assert [g[0]["group_id"] for g in groups] == ["early", "late"] and len(groups[1]) == 2


def test_bins_split_the_consumed_steps_evenly_and_say_nan_where_empty():
    rows = [rec(f"g{s}", s, 0.0, 10 * (s + 1)) for s in range(8)]
    groups = length_drift.trained_groups(rows)
    assert length_drift.by_bins(groups, lambda r: len(r["response_ids"]), 4) == [15.0, 35.0, 55.0, 75.0]
    sparse = length_drift.by_bins(length_drift.trained_groups([rec("a", 0, 0, 10), rec("b", 7, 0, 30)]),
                                  lambda r: len(r["response_ids"]), 4)
    assert sparse[0] == 10.0 and sparse[3] == 30.0 and math.isnan(sparse[1]) and math.isnan(sparse[2])


def test_summary_counts_and_render():
    rows = [rec("a", 0, 1.0, 40), rec("a", 0, 0.0, 160, finish="length"), rec("b", 3, 0.0, 10, status="dropped_stale"),
            rec("c", 7, 1.0, 20), rec("c", 7, 0.0, 30)]
    s = length_drift.summarize(rows, mask_truncated=True)
    assert s["trained"] == 4 and s["dropped_stale"] == 1 and s["cut_second_half"] == 0.0 and s["reward_by_half"] == [0.5, 0.5]
    result = {"args": {"samples": "4", "seed": "1", "lr": "5e-4"}, "argv": [],
              "results": [{"variant": "recipe", "max_staleness": 3, "steps": 4, "wall_s": 12.0, **s}]}
    text = length_drift.render(result)
    assert "| recipe | 3 | 100 nan nan nan nan nan nan 25 | 0.00 | 0.500 → 0.500 |" in text
