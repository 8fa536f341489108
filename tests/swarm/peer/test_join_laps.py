"""JoinLaps: each step of a join timed on its own, a step named twice adds up, and the event's fields add up to the
time since the process started."""

from __future__ import annotations

import time

import pytest

from swarm.peer.join_laps import JoinLaps, process_age


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_laps_time_each_step_and_a_step_named_twice_adds_up():
    clock = Clock()
    laps = JoinLaps(clock, start=2.5)
    clock.now += 1.25
    assert laps.lap("dht") == pytest.approx(1.25)
    clock.now += 4.0
    laps.lap("links")
    clock.now += 0.5
    laps.lap("admission")
    clock.now += 3.0
    laps.lap("links")
    assert laps.laps == {"start": 2.5, "dht": 1.25, "links": 7.0, "admission": 0.5}
    assert laps.total == pytest.approx(11.25)
    assert laps.longest(2) == "links 7.0 s, start 2.5 s"
    clock.now += 0.75
    fields = laps.finish("stage")
    assert fields == {"seconds": 12.0, "laps": {"start": 2.5, "dht": 1.25, "links": 7.0, "admission": 0.5,
                                                 "stage": 0.75}}
    fields["laps"]["stage"] = 99  # the event's copy, not the laps themselves
    assert laps.laps["stage"] == 0.75


def test_the_first_lap_is_the_process_age():
    age = process_age()
    assert 0.0 < age < time.time()  # this test process started before this call, and after the epoch
    laps = JoinLaps()
    assert laps.laps["start"] >= round(age, 3)
