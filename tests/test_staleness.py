"""The staleness policy, with numbers worked out by hand."""
from asyncrl.core.staleness import admissible, admission_capacity, expiring, is_stale, staleness, waits_for_expiring


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


def test_a_group_expires_at_the_last_version_that_may_train_on_it():
    assert expiring(5, 2, max_staleness=3) and not expiring(5, 3, max_staleness=3)
    assert not expiring(6, 2, max_staleness=3)  # already stale: nothing left to wait for
    assert expiring(4, 4, max_staleness=0)  # synchronous: every group of the current version


def test_the_last_batch_at_a_version_waits_for_an_expiring_group_in_flight():
    # version 5, bound 2: a group admitted at version 3 can be trained on now and never again
    last = dict(version=5, max_staleness=2, n_groups=2, last_at_version=True)
    assert waits_for_expiring(in_flight=[3, 5], buffered=[4, 5, 5], **last)
    assert not waits_for_expiring(in_flight=[4, 5], buffered=[4, 5, 5], **last)  # none in flight expires here
    assert waits_for_expiring(in_flight=[3], buffered=[3], **last)  # one ready expiring group: the batch has room for the other
    assert not waits_for_expiring(in_flight=[3], buffered=[3, 3], **last)  # the ready ones fill it: they go first
    assert not waits_for_expiring(in_flight=[3], buffered=[4, 5], **{**last, "last_at_version": False})  # the version holds on
    assert not waits_for_expiring(in_flight=[2], buffered=[4, 5], **last)  # past the bound already: waiting saves nothing
