"""The watchdog's deadlines (asyncrl.core.deadlines): from the stage's own recent times, never below the floor, and
a first one before anything was measured; the report names who, which call, how long and why that deadline."""
from asyncrl.core.deadlines import StageClock, hung_message


def test_a_deadline_follows_the_stages_longest_recent_time_above_a_floor():
    clock = StageClock(factor=10, floor_s=60, first_s=900, window=3)
    assert clock.deadline("weight load") == 900  # nothing measured yet
    clock.record("weight load", 2.0)
    assert clock.deadline("weight load") == 60  # 10 x 2 s is under the floor
    for s in (30.0, 1.0, 1.0):
        clock.record("weight load", s)
    assert clock.deadline("weight load") == 300  # 10 x the longest of the last 3
    clock.record("weight load", 1.0)
    assert clock.deadline("weight load") == 60  # the 30 s one left the window
    assert clock.deadline("train step") == 900  # stages are timed apart


def test_the_report_says_who_what_how_long_and_why():
    clock = StageClock(factor=10, floor_s=5, first_s=20)
    clock.record("weight load", 1.5)
    text = hung_message("rollout worker 1", "update_weights", 16.2, clock, "weight load", "receiving and loading version 3")
    assert text == ("rollout worker 1 did not finish update_weights (receiving and loading version 3) in 16 s: the deadline was "
                    "15 s (10 x its longest of the last 1 (1.50 s), at least 5 s)")
