"""The staleness policy, with numbers worked out by hand."""
from asyncrl.core.staleness import admissible, admission_capacity, is_stale, staleness


def test_staleness_and_bound():
    assert staleness(5, 3) == 2
    assert not is_stale(5, 3, max_staleness=2)
    assert is_stale(5, 2, max_staleness=2)
    assert is_stale(1, 0, max_staleness=0)  # synchronous: only the current version


def test_admission_capacity_areal_rule():
    # version 2, staleness 1, 4 groups per version: (2 + 1 + 1) * 4 = 16 live groups
    assert admission_capacity(2, 1, 4) == 16
    assert admission_capacity(0, 0, 4) == 4  # synchronous: one batch ahead, no more


def test_admissible_clamps_by_staleness_and_capacity():
    # capacity by staleness at v0, s1, 4/version: 8; 6 already live -> 2 more
    assert admissible(5, live_groups=6, outstanding_groups=6, version=0, max_staleness=1, groups_per_version=4, capacity_groups=64) == 2
    # buffer capacity 7 with 6 outstanding -> 1 more
    assert admissible(5, live_groups=6, outstanding_groups=6, version=3, max_staleness=1, groups_per_version=4, capacity_groups=7) == 1
    # nothing left: never negative
    assert admissible(3, live_groups=9, outstanding_groups=9, version=0, max_staleness=1, groups_per_version=4, capacity_groups=64) == 0
    assert admissible(3, live_groups=0, outstanding_groups=0, version=0, max_staleness=1, groups_per_version=4, capacity_groups=64) == 3


def test_a_worker_whose_weights_are_too_old_is_not_admitted():
    free = dict(live_groups=0, outstanding_groups=0, groups_per_version=4, capacity_groups=64)
    assert admissible(3, version=2, max_staleness=0, worker_version=1, **free) == 0  # would be stale at once
    assert admissible(3, version=2, max_staleness=0, worker_version=2, **free) == 3  # loaded: admitted
    assert admissible(3, version=2, max_staleness=1, worker_version=1, **free) == 3  # one behind is within the bound
    assert admissible(3, version=2, max_staleness=0, worker_version=None, **free) == 3  # version unknown: not judged
