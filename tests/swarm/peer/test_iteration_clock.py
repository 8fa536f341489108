"""A peer's deadlines follow the schedule's prediction, then the measured iteration times."""

from __future__ import annotations

import dataclasses

import pytest

from swarm.peer.iteration_clock import (
    HOP_DEADLINE_FACTOR,
    HOP_DEADLINE_SLACK,
    MIN_ITERATION_DEADLINE,
    SILENCE_FLOOR,
    STALL_FACTOR,
    IterationClock,
)
from tests.swarm.coordinator.conftest import make_records, make_replanner


@pytest.fixture(scope="module")
def schedule():
    return make_replanner().plan(make_records(), epoch=0, start_iteration=0)


def commits(clock: IterationClock, *periods: float) -> None:
    now = 1000.0
    clock.committed(now)
    for period in periods:
        now += period
        clock.committed(now)


def test_the_iteration_deadline_follows_measured_iteration_times(schedule):
    predicted = schedule.predicted_iteration_seconds
    assert IterationClock(300.0).iteration_deadline(schedule) == min(300.0, max(MIN_ITERATION_DEADLINE, 5 * predicted))
    clock = IterationClock(300.0)
    commits(clock, 20.0, 21.0, 19.0)
    assert clock.iteration_deadline(schedule) == pytest.approx(100.0)  # five times the measured median
    clock = IterationClock(300.0)
    commits(clock, 200.0)
    assert clock.iteration_deadline(schedule) == 300.0  # never above the configured cap
    clock = IterationClock(300.0)
    commits(clock, 0.5)
    assert clock.iteration_deadline(schedule) == MIN_ITERATION_DEADLINE


def test_hop_deadlines_scale_the_planned_round_trips_to_measured_iterations(schedule):
    holder = schedule.data_holders[0]
    clock = IterationClock(300.0)
    planned = clock.hop_deadlines(schedule, holder)
    assert set(planned) == {r.microbatch for r in schedule.routes_from(holder)}
    assert all(d > HOP_DEADLINE_SLACK for d in planned.values())
    commits(clock, 2 * schedule.predicted_iteration_seconds)  # iterations take twice what was planned
    slower = clock.hop_deadlines(schedule, holder)
    for mb, d in planned.items():
        trip = (d - HOP_DEADLINE_SLACK) / HOP_DEADLINE_FACTOR
        assert slower[mb] == pytest.approx(HOP_DEADLINE_FACTOR * 2 * trip + HOP_DEADLINE_SLACK)


def test_a_backward_deadline_follows_its_own_path_once_measured(schedule):
    """One slow peer makes iterations four times as long as planned: the microbatch whose path goes through it
    gets a longer deadline, those whose backwards came back as planned keep theirs."""
    holder = schedule.data_holders[0]
    clock = IterationClock(300.0)
    planned = {mb: (d - HOP_DEADLINE_SLACK) / HOP_DEADLINE_FACTOR
               for mb, d in clock.hop_deadlines(schedule, holder).items()}
    slow, *fast = sorted(planned)
    assert fast, "the holder needs two microbatches"
    commits(clock, 4 * schedule.predicted_iteration_seconds)
    for seconds in (3.0, 5.0, 4.0):  # the slow path, as measured: median 4 planned round trips
        clock.round_trip(schedule.epoch, slow, seconds * planned[slow])
    for mb in fast:
        clock.round_trip(schedule.epoch, mb, 0.5 * planned[mb])  # faster than planned: the plan's stays
    deadlines = clock.hop_deadlines(schedule, holder)
    assert deadlines[slow] == pytest.approx(HOP_DEADLINE_FACTOR * 4 * planned[slow] + HOP_DEADLINE_SLACK)
    for mb in fast:
        assert deadlines[mb] == pytest.approx(HOP_DEADLINE_FACTOR * planned[mb] + HOP_DEADLINE_SLACK)
    clock.round_trip(schedule.epoch + 1, slow, planned[slow])  # a new epoch's paths: the old measurements go
    assert clock.hop_deadlines(schedule, holder)[fast[0]] == pytest.approx(
        HOP_DEADLINE_FACTOR * 4 * planned[fast[0]] + HOP_DEADLINE_SLACK)  # back to the measured iterations


def test_a_silent_peer_is_probed_and_given_up_on_within_an_iteration_or_a_few_seconds(schedule):
    fast = dataclasses.replace(schedule, predicted_iteration_seconds=0.5)
    clock = IterationClock(300.0)
    commits(clock, 0.5, 0.5, 0.5)  # fast iterations: the floor, so that a loaded live peer is not taken for dead
    assert clock.probe_timeout(fast) == SILENCE_FLOOR and clock.averaging_overdue(fast) == SILENCE_FLOOR
    clock = IterationClock(300.0)
    commits(clock, 40.0, 40.0, 40.0)  # slow ones (large messages): in proportion
    assert clock.probe_timeout(schedule) == pytest.approx(20.0)
    assert clock.averaging_overdue(schedule) == pytest.approx(40.0)


def test_a_live_next_hop_holding_a_microbatch_is_given_up_on_first_by_the_peer_next_to_it(schedule):
    clock = IterationClock(300.0)
    probe = clock.probe_timeout(schedule)
    limits = {p: clock.stall_limits(schedule, p) for p in schedule.placement}
    for p, by_mb in limits.items():
        deadlines = clock.hop_deadlines(schedule, p)
        assert set(by_mb) == set(deadlines)
        # well past the point where a silent next hop is checked on and found (its deadline, then a probe)
        assert all(by_mb[mb] >= STALL_FACTOR * deadlines[mb] + 2 * probe for mb in by_mb)
    for r in schedule.routes:
        waiting = [p for p in r.nodes if r.microbatch in limits[p]]  # the peers that await a backward of it
        # a peer waits longer than every peer after it on the path: the one next to a stalled peer gives up on
        # it first, and those before hear that the attempt broke instead of blaming their own next hops
        for earlier, later in zip(waiting, waiting[1:]):
            assert limits[earlier][r.microbatch] > limits[later][r.microbatch] + probe
