"""bench/weight_verify.py's arithmetic: medians over the settled syncs, and a refusal of an unverified or impossible one."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from weight_verify import render, summarize  # noqa: E402


def _row(step, verify, send, load, verified=1.0, mismatches=0):
    return {"step": step, "sync/verified": verified, "sync/mismatches": mismatches, "time/weight_verify_s": verify,
            "time/weight_verify_learner_s": verify * 0.75, "time/weight_verify_engine_s": verify * 0.25,
            "time/weight_send_s": send, "time/weight_load_s": load, "weights/sync_bytes": 2**20}


def test_the_ratio_is_of_medians_over_the_settled_syncs():
    rows = [{"step": 0}, _row(1, 0.1, 0.5, 1.5), _row(2, 0.3, 0.7, 1.3), _row(3, 0.2, 0.6, 1.4)]
    s = summarize(rows)
    assert s["syncs"] == 3 and s["ratio"] == pytest.approx(0.2 / 2.0)
    assert "| 200 ms (150 ms learner CPU, 50 ms engine) | 600 ms | 1400 ms | 0.100 |" in render({"config": "c.yaml", **s})
    assert "the learner checks one row in 2 of each matrix" in render({"config": "c.yaml", "verify_stride": 2, **s})
    assert "every row checked" in render({"config": "c.yaml", "verify_stride": 1, **s})
    old = [{k: v for k, v in r.items() if "verify_" not in k or k == "time/weight_verify_s"} for r in rows]  # a record before the split
    assert "| 200 ms (not recorded apart) | 600 ms |" in render({"config": "c.yaml", **summarize(old)})


@pytest.mark.parametrize("row, why", [(_row(1, 0.1, 0.5, 1.5, verified=0.5), "verified 0.5"),
                                      (_row(1, 0.1, 0.5, 1.5, mismatches=1), "mismatches 1"),
                                      (_row(1, 0.0, 0.5, 1.5), "not positive")])
def test_an_unverified_mismatched_or_impossible_sync_stops_the_benchmark(row, why):
    with pytest.raises(ValueError, match=why):
        summarize([row])
    with pytest.raises(ValueError, match="no settled sync"):
        summarize([{"step": 0}])
