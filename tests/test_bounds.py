"""The overlap bound: the formulas, and the checks that keep an impossible or unlike comparison out of a table."""
import pytest

from asyncrl.analysis.bounds import Phases, check_efficiency, efficiency, ideal_speedup, split_bound, unlike
from asyncrl.core.config import load_config


def test_pipeline_and_serial_time():
    p = Phases(gen_s=2.0, train_s=1.0, sync_s=0.5)
    assert p.serial_s == 3.5 and p.pipelined_s == 2.0  # rollout-bound
    assert Phases(gen_s=1.0, train_s=1.5, sync_s=0.5).pipelined_s == 2.0  # learner-bound: the sync is on its path
    with pytest.raises(ValueError, match="negative"):
        Phases(-1.0, 1.0, 0.0)


def test_achieved_speedup_is_ideal_times_efficiency():
    p = Phases(gen_s=2.0, train_s=1.0, sync_s=0.0)
    sync_run, async_run = 3.0, 2.5  # per sample
    assert ideal_speedup(sync_run, p) == pytest.approx(1.5)
    assert efficiency(async_run, p) == pytest.approx(0.8)
    assert ideal_speedup(sync_run, p) * efficiency(async_run, p) == pytest.approx(sync_run / async_run)


def test_split_bound_on_two_units():
    # perfect scaling: taking turns on both units is as fast as the best split, never slower
    assert split_bound(1.0, 1.0, 2.0, 2.0) == pytest.approx(1.0)
    assert split_bound(1.0, 3.0, 2.0, 2.0) == pytest.approx(2.0 / 3.0)  # unbalanced phases: the split loses
    # no scaling at all: overlapping the two doubles the rate of balanced phases
    assert split_bound(1.0, 1.0, 1.0, 1.0) == pytest.approx(2.0)
    # measured on SmolLM2 (generation 1.65x faster on two cores): learner-bound at 1 core each
    assert split_bound(0.6, 1.5, 1.65, 1.6) < 1.0


def test_an_impossible_efficiency_fails_and_names_itself():
    check_efficiency(1.0, "x")
    check_efficiency(1.049, "x")
    with pytest.raises(ValueError, match=r"seed 2: efficiency 1\.430 > 1\.05"):
        check_efficiency(1.43, "seed 2")


def test_runs_compare_only_when_they_differ_in_scheduling():
    asyn = load_config(None, ["learner.batch_size=16", "rollout.cpu_affinity=[0]"]).to_dict()
    sync = load_config(None, ["learner.batch_size=64", "learner.mini_batches=4", "buffer.max_staleness=0"]).to_dict()
    assert unlike(asyn, sync) == []
    assert unlike(asyn, load_config(None, ["learner.batch_size=64", "learner.lr=1e-3"]).to_dict()) == [
        "learner.lr", "update size (learner.batch_size / mini_batches): 16 vs 64"]
    assert unlike(asyn, load_config(None, ["learner.batch_size=16", "run.seed=1"]).to_dict()) == ["run.seed"]
