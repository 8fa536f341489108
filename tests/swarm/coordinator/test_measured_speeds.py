"""Plans take each peer's measured speed; a peer whose speed drifts has the paths re-planned where that pays."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scheduler.constants import BACKWARD_FACTOR, LOSS_FACTOR
from scheduler.paths import PathRules
from scheduler.schedule import Schedule
from swarm.control.messages import Pace
from swarm.coordinator.cost_drift import REPLAN_GAIN
from swarm.coordinator.measured_speeds import DRIFT, FASTEST, MeasuredSpeeds
from swarm.coordinator.scheduler import Scheduler
from swarm.events import EVENT_ATTR
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord
from tests.swarm.coordinator.conftest import make_config, make_records, make_scheduler
from tests.swarm.coordinator.test_scheduler import commit, fresh, planned, published

SPEED = 0.05
"""Every test peer's announced seconds per layer."""


def schedule_of(placement: dict[str, int]) -> Schedule:
    return Schedule(epoch=0, rules=PathRules(3, 3), placement=placement, memory=dict.fromkeys(placement, 2), routes=())


def record(peer: str, loss_seconds: float = 0.0) -> PeerRecord:
    return PeerRecord(peer_id=peer, stage=-1, seconds_per_layer=SPEED, memory_slots=2, loss_seconds=loss_seconds)


def relay_seconds(layers: int, microbatches: int, slowdown: float = 1.0) -> float:
    """What `microbatches` forwards and backwards of `layers` layers take on a peer `slowdown` times slower than
    announced."""
    return microbatches * layers * SPEED * (1 + BACKWARD_FACTOR) * slowdown


def test_a_peers_slowdown_is_its_passes_over_what_its_announced_speed_gives_them():
    speeds, schedule = MeasuredSpeeds((2, 3, 3)), schedule_of({"h": 0, "a": 1, "b": 2})
    a = record("a")
    speeds.note("a", schedule, 8, relay_seconds(3, 4), a)
    assert speeds.measured("a") is None  # one report is not a measurement
    speeds.note("a", schedule, 8, relay_seconds(3, 4, 3.0), a)
    assert speeds.measured("a") == pytest.approx(2.0)  # the median of its reports so far
    speeds.note("a", schedule, 8, relay_seconds(3, 4), a)
    speeds.note("a", schedule, 8, relay_seconds(3, 4, 1.2), a)
    assert speeds.measured("a") == pytest.approx(1.2)  # of its last three: 3.0, 1.0, 1.2
    # a holder's passes carry its loss step: at its measured time, or LOSS_FACTOR x its forward where it said none
    for loss in (0.03, 0.0):
        h = record("h", loss_seconds=loss)
        step = loss or LOSS_FACTOR * 2 * SPEED
        for _ in range(2):
            speeds.note("h", schedule, 6, 3 * (relay_seconds(2, 1) + step) * 1.5, h)
        assert speeds.measured("h") == pytest.approx(1.5)
        speeds.forget(["h"])
    # a claim of passes that took no time counts as twice its announced speed, no quicker
    for _ in range(2):
        speeds.note("b", schedule, 8, 0.0, record("b"))
    assert speeds.measured("b") == FASTEST
    # nothing to measure: no passes, no time, an epoch or a placement that does not know it, no record to compare
    for args in (("x", schedule, 8, 1.0, record("x")), ("h", None, 8, 1.0, record("h")),
                 ("h", schedule, 0, 1.0, record("h")), ("h", schedule, 8, math.nan, record("h")),
                 ("h", schedule, 8, 1.0, None)):
        speeds.note(*args)
        speeds.note(*args)
    assert speeds.measured("x") is None and speeds.measured("h") is None
    off = MeasuredSpeeds((2, 3, 3), enabled=False)
    for _ in range(3):
        off.note("a", schedule, 8, relay_seconds(3, 4, 3.0), a)
    assert off.measured("a") is None and off.slowdown("a") is None and off.applied({"a": a}) == {"a": a}


def test_the_plans_take_a_slowdown_relative_to_its_kinds_so_what_every_peer_shares_is_none():
    """A loaded host, or a pass's fixed costs the per-layer model leaves out, make every peer's passes 3x what it
    announced: that is no peer's slowdown. One relay at 5.4x is 1.8x its kind's; holders are compared with holders
    (their passes carry the loss step and the embedding: fixed costs of their own)."""
    speeds = MeasuredSpeeds((2, 3, 3))
    schedule = schedule_of({"h": 0, "g": 0, "a": 1, "b": 1, "c": 2})
    for _ in range(2):
        for relay, slowdown in (("a", 3.0), ("b", 3.0), ("c", 5.4)):
            speeds.note(relay, schedule, 8, relay_seconds(3, 4, slowdown), record(relay))
        for holder in ("h", "g"):
            speeds.note(holder, schedule, 6, 3 * (relay_seconds(2, 1) + LOSS_FACTOR * 2 * SPEED) * 6.0,
                        record(holder))
    assert speeds.measured("c") == pytest.approx(5.4) and speeds.slowdown("c") == pytest.approx(1.8)
    assert speeds.slowdown("a") == pytest.approx(1.0) and speeds.slowdown("h") == pytest.approx(1.0)
    planned = speeds.applied({p: record(p) for p in "hgabc"})
    assert planned["c"].seconds_per_layer == pytest.approx(1.8 * SPEED) and planned["a"].seconds_per_layer == SPEED
    # of two relays the quicker is the reference (the lower median)
    pair = MeasuredSpeeds((2, 3, 3))
    for _ in range(2):
        pair.note("a", schedule, 8, relay_seconds(3, 4, 3.0), record("a"))
        pair.note("b", schedule, 8, relay_seconds(3, 4, 5.4), record("b"))
    assert pair.slowdown("b") == pytest.approx(1.8) and pair.slowdown("a") == pytest.approx(1.0)
    # one relay of three claiming passes that took no time neither moves the reference nor counts under half of it
    for _ in range(3):
        speeds.note("a", schedule, 8, 0.0, record("a"))
    assert speeds.slowdown("a") == FASTEST and speeds.slowdown("c") == pytest.approx(1.8)


def test_plans_take_the_measured_speeds_and_a_drift_is_one_past_the_planned_slowdown():
    speeds, schedule = MeasuredSpeeds((2, 2, 2)), schedule_of({"h": 0, "a": 1, "b": 2})
    a, b = record("a", loss_seconds=0.02), record("b")
    for _ in range(2):
        speeds.note("a", schedule, 8, relay_seconds(2, 4, 1.6), a)
        speeds.note("b", schedule, 8, relay_seconds(2, 4), b)  # the other relay runs as announced
    assert speeds.drifted(["a", "b"]) == {"a": (1.0, pytest.approx(1.6))}
    planned = speeds.applied({"a": a, "b": b})
    assert planned["b"] == b and planned["a"].seconds_per_layer == pytest.approx(1.6 * SPEED)
    assert planned["a"].loss_seconds == pytest.approx(1.6 * 0.02)
    assert speeds.drifted(["a", "b"]) == {}  # planned at what it measures: no drift until it changes again
    for _ in range(2):
        speeds.note("a", schedule, 8, relay_seconds(2, 4, 1.6 * DRIFT * 0.9), a)
    assert speeds.drifted(["a"]) == {}
    for _ in range(2):
        speeds.note("a", schedule, 8, relay_seconds(2, 4, 1.6 / DRIFT), a)  # quicker again counts too
    assert speeds.drifted(["a"]) == {"a": (pytest.approx(1.6), pytest.approx(1.6 / DRIFT))}
    speeds.forget(["a"])  # gone or benched: measured afresh, planned at its announced speed meanwhile
    assert speeds.slowdown("a") is None and speeds.drifted(["a"]) == {} and speeds.applied({"a": a})["a"] is a


def test_a_predecessors_slowdowns_count_until_measured_anew_and_malformed_ones_are_dropped():
    speeds = MeasuredSpeeds((2, 2, 2))
    assert speeds.restore({"a": 1.7, "b": 0.1, "c": "2", "d": True, "": 1.5, "e": math.inf, 5: 2.0}) == [
        "speeds['b'] = '0.1'", "speeds['c'] = '2'", "speeds['d'] = 'True'", "speeds[''] = '1.5'",
        "speeds['e'] = 'inf'", "speeds['5'] = '2.0'"]
    assert speeds.slowdown("a") == 1.7 and speeds.drifted(["a"]) == {} and speeds.to_meta() == {"a": 1.7}
    assert speeds.restore([1.7]) and speeds.restore(None) == []
    schedule = schedule_of({"h": 0, "a": 1})
    for _ in range(2):
        speeds.note("a", schedule, 8, relay_seconds(2, 4), record("a"))
    assert speeds.slowdown("a") == pytest.approx(1.0) and speeds.drifted(["a"]) == {"a": (1.7, pytest.approx(1.0))}


def near(records: dict[str, PeerRecord]) -> dict[str, PeerRecord]:
    """`records` on a fast network (2 ms, 1 GB/s links): compute is what an iteration waits for."""
    return {p: dataclasses.replace(r, links={q: (0.002, 1e9) for q in r.links}) for p, r in records.items()}


def paces(s: Scheduler, records: dict[str, PeerRecord], slowdowns: dict[str, float], t: float) -> list:
    """At `t`, every relay of the newest epoch reports the last committed iteration at `slowdowns` times its announced
    speed (1 where not given); the actions of the reports that asked for any."""
    assert published(s.observe(fresh(records), t)) == []
    actions, layers = [], s.replanner.layers_per_stage
    for p, st in s.schedule.placement.items():
        if st > 0:
            seconds = relay_seconds(layers[st], 4, slowdowns.get(p, 1.0))
            actions += s.handle(p, Pace(peer=p, iteration=s.completed - 1, epoch=s.schedule.epoch, operations=8,
                                        compute=seconds), t)
    return actions


def drift_events(caplog) -> list[dict]:
    return [getattr(r, EVENT_ATTR) for r in caplog.records
            if getattr(r, EVENT_ATTR, {}).get("event") == "costs_drifted"]


def crossings(schedule: Schedule, peer: str) -> int:
    return sum(peer in r.peers for r in schedule.routes)


def relay_with_a_mate(s: Scheduler, records: dict[str, PeerRecord]) -> tuple[Schedule, str]:
    """`s`'s first epoch of `records` and a relay of it with a stage mate, once iteration 0 is committed."""
    first = planned(s, records)
    commit(s, 1, now=100.0)
    return first, next(p for p, st in first.placement.items() if st > 0 and len(first.stage_peers(st)) > 1)


def reported_at(s: Scheduler, records: dict[str, PeerRecord], relay: str, slowdown: float,
                times: tuple[float, ...]) -> None:
    """At each of `times`, `relay` reports passes `slowdown` times slower than announced (the others as announced),
    and the next commit comes a second later: nothing is published."""
    for t in times:
        paces(s, records, {relay: slowdown}, t)
        assert published(commit(s, 1, now=t + 1)) == []


def test_a_relay_merely_slower_than_announced_has_the_paths_replanned_around_it_once(caplog):
    """1.8x slower than announced (not slow enough to bench): once two reports say so, the commit after them
    re-plans the paths from the next iteration on the same placement, fewer of them through it; the same pace after
    that re-plans nothing."""
    records = near(make_records())
    s = make_scheduler("skippipe", measured_speeds=True)
    first, slow = relay_with_a_mate(s, records)
    assert paces(s, records, {slow: 1.8}, 101.0) == []
    assert published(commit(s, 1, now=102.0)) == []  # one report is not a measurement
    assert paces(s, records, {slow: 1.8}, 103.0) == []
    with caplog.at_level("INFO"):
        (replanned,) = published(commit(s, 1, now=104.0))
    assert replanned.placement == first.placement and replanned.meta["start_iteration"] == s.completed + 1
    assert crossings(replanned, slow) < crossings(first, slow) and replanned.meta["shards"] == first.meta["shards"]
    (drift,) = drift_events(caplog)
    assert drift["peers"] == {slow: 1.8} and drift["links"] == {} and drift["replanned"] is True
    assert drift["gain"] >= REPLAN_GAIN
    assert replanned.meta["slow"] == {"speeds": {slow: 1.8}} and not s.slow.benched(104.0)
    for t in (105.0, 107.0):
        assert paces(s, records, {slow: 1.8}, t) == []
        assert published(commit(s, 1, now=t + 1)) == []
    assert s.schedule is replanned


def test_a_drift_whose_replan_does_not_pay_publishes_nothing_and_is_not_weighed_again(caplog):
    """On the geo-distributed links an iteration waits for the network: 1.8x slower passes on one relay do not make
    re-planned paths `REPLAN_GAIN` quicker (they simulate 1% slower). Said once (not at every commit); the epoch
    stays."""
    records = make_records()
    s = make_scheduler("skippipe", measured_speeds=True)
    first, slow = relay_with_a_mate(s, records)
    with caplog.at_level("INFO"):
        reported_at(s, records, slow, 1.8, (101.0, 103.0, 105.0))
    (drift,) = drift_events(caplog)
    assert drift["replanned"] is False and drift["gain"] < REPLAN_GAIN and s.schedule is first


def test_a_successor_plans_on_its_predecessors_measured_speeds():
    records = near(make_records())
    s = make_scheduler("skippipe", measured_speeds=True)
    first, slow = relay_with_a_mate(s, records)
    paces(s, records, {slow: 1.8}, 101.0)
    commit(s, 1, now=102.0)
    paces(s, records, {slow: 1.8}, 103.0)
    assert published(commit(s, 1, now=104.0))
    heir = make_scheduler("skippipe", measured_speeds=True)
    (resumed,) = published(heir.resume(s.epochs.all, s.completed, fresh(records), 5000.0))
    assert heir.slow.speeds.slowdown(slow) == 1.8 and resumed.meta["slow"] == {"speeds": {slow: 1.8}}
    assert crossings(resumed, slow) < crossings(first, slow)


def test_a_run_plans_on_the_announced_speeds_unless_configured_to_measure(caplog):
    """`swarm.measured_speeds` is off by default; on, it travels in the run spec (a successor keeps it)."""
    config = make_config("skippipe", measured_speeds=True)
    assert RunConfig.from_spec(config.to_spec(coordinator="c", vocab_size=512))[0].measured_speeds is True
    assert "measured_speeds" not in make_config().to_spec(coordinator="c", vocab_size=512).hyperparameters
    with pytest.raises(ValueError, match="measured_speeds"):
        make_config("skippipe", measured_speeds="yes")
    records = near(make_records())
    s = make_scheduler("skippipe")
    first, slow = relay_with_a_mate(s, records)
    with caplog.at_level("INFO"):
        reported_at(s, records, slow, 1.8, (101.0, 103.0, 105.0))
    assert drift_events(caplog) == [] and s.schedule is first
