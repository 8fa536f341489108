"""A relay whose own passes stay far slower than the other relays' is found from its pace reports and benched."""

from __future__ import annotations

from scheduler.constants import BACKWARD_FACTOR
from scheduler.paths import PathRules
from scheduler.schedule import Schedule
from swarm.control.messages import Benched, Gone, Pace
from swarm.coordinator.benches import BENCH
from swarm.coordinator.scheduler import Scheduler
from swarm.coordinator.slow_relays import SlowRelays
from swarm.events import EVENT_ATTR
from swarm.wire import PeerRecord
from tests.swarm.coordinator.conftest import make_config, make_records, make_scheduler, model_of
from tests.swarm.coordinator.test_scheduler import commit, fresh, notices, planned, published

PLACEMENT = {"h0": 0, "h1": 0, "a": 1, "b": 1, "c": 2, "d": 2}


def schedule_of(placement: dict[str, int]) -> Schedule:
    return Schedule(epoch=0, rules=PathRules(3, 3), placement=placement, memory=dict.fromkeys(placement, 2), routes=())


def pace(peer: str, seconds_per_pass: float, iteration: int = 0, epoch: int = 0, operations: int = 8) -> Pace:
    return Pace(peer=peer, iteration=iteration, epoch=epoch, operations=operations,
                compute=seconds_per_pass * operations)


def iteration_of(relays: SlowRelays, schedule: Schedule, iteration: int, seconds: dict[str, float],
                 announced: float | dict[str, float] = 0.05) -> list[str]:
    """Each relay of `seconds` reports its seconds per pass of `iteration`, in that order: the relays found slow."""
    slow: list[str] = []
    for p, s in seconds.items():
        slow += relays.note(pace(p, s, iteration), schedule,
                            announced=announced[p] if isinstance(announced, dict) else announced)
    return slow


def test_a_relay_slow_in_two_of_its_last_three_reports_is_slow_for_good_and_judged_afresh_after():
    relays, schedule = SlowRelays((2, 2, 2)), schedule_of(PLACEMENT)
    quick = {"b": 0.2, "c": 0.2, "d": 0.2}
    assert iteration_of(relays, schedule, 0, {**quick, "a": 0.9}) == []  # one slow iteration is a hiccup
    assert iteration_of(relays, schedule, 1, {**quick, "a": 0.2}) == []
    assert iteration_of(relays, schedule, 2, {**quick, "a": 0.9}) == ["a"]
    assert round(relays.slowdown("a"), 2) == 4.5 and "4.5x" in relays.why("a")
    assert iteration_of(relays, schedule, 3, {**quick, "a": 0.9}) == []  # its verdicts start over
    assert iteration_of(relays, schedule, 4, {**quick, "a": 0.9}) == ["a"]
    relays.forget(["a"])
    assert relays.slowdown("a") == 0.0 and iteration_of(relays, schedule, 5, {**quick, "a": 0.9}) == []


def test_a_relay_is_judged_against_the_others_reports_of_its_own_iteration():
    """A burst of load slows every relay of the iterations it hits: a relay that reports first is not held against
    the others' reports of a quieter iteration, and each waits for two others of its iteration."""
    relays, schedule = SlowRelays((2, 2, 2)), schedule_of(PLACEMENT)
    assert iteration_of(relays, schedule, 0, {"a": 0.2, "b": 0.2, "c": 0.2, "d": 0.2}) == []
    for it in (1, 2, 3):  # loaded: all four 4x slower; c and d report first
        assert iteration_of(relays, schedule, it, {"c": 0.8, "d": 0.8, "a": 0.8, "b": 0.8}) == []
    # slow in its own iteration, it is judged once two others of it came, whichever order they come in
    assert relays.note(pace("c", 0.9, 4), schedule, announced=0.05) == []
    assert relays.note(pace("c", 0.9, 5), schedule, announced=0.05) == []
    assert relays.note(pace("a", 0.2, 4), schedule, announced=0.05) == []
    assert relays.note(pace("a", 0.2, 5), schedule, announced=0.05) == []
    assert relays.note(pace("b", 0.2, 4), schedule, announced=0.05) == []  # c's first slow report
    assert relays.note(pace("b", 0.2, 5), schedule, announced=0.05) == ["c"]
    # a report too old to meet its iteration's others is not judged, nor kept
    assert iteration_of(relays, schedule, 20, {"a": 0.2, "b": 0.2, "d": 0.2}) == []
    assert iteration_of(relays, schedule, 6, {"a": 0.2, "b": 0.2, "d": 0.9}) == []
    assert iteration_of(relays, schedule, 7, {"a": 0.2, "b": 0.2, "d": 0.9}) == []


def test_a_relay_is_judged_slow_only_against_its_measured_and_its_announced_speed_both():
    relays, schedule = SlowRelays((2, 2, 2)), schedule_of(PLACEMENT)
    quick = {"b": 0.2, "c": 0.2, "d": 0.2}
    # it announced a machine four times slower: the plan gave it its due, it is not slow for that
    announced = {"a": 0.2, "b": 0.05, "c": 0.05, "d": 0.05}
    assert [iteration_of(relays, schedule, it, {**quick, "a": 0.8}, announced) for it in range(3)] == [[], [], []]
    # its announcement was measured on a quiet host: three times quicker than it runs now, as quick as the others
    announced = {**announced, "a": 0.015}
    assert [iteration_of(relays, schedule, it, {**quick, "a": 0.2}, announced) for it in range(3, 6)] == [[]] * 3
    # the others run three times quicker than they announced; it runs as slow as it said it would (a slower machine)
    quick_relays, announced = SlowRelays((2, 2, 2)), {"a": 0.4, "b": 0.3, "c": 0.3, "d": 0.3}
    assert [iteration_of(quick_relays, schedule, it, {**quick, "a": 0.8}, announced) for it in range(3)] == [[]] * 3
    # three times slower than it said: slow
    assert [iteration_of(quick_relays, schedule, it, {**quick, "a": 2.4}, announced) for it in (3, 4)] == [[], ["a"]]


def test_only_relays_of_the_reports_epoch_are_judged_and_against_two_others_at_least():
    relays = SlowRelays((2, 2, 2))
    lonely = schedule_of({"h0": 0, "a": 1, "b": 2})
    assert [iteration_of(relays, lonely, it, {"b": 0.2, "a": 9.0}) for it in range(3)] == [[]] * 3
    schedule = schedule_of(PLACEMENT)
    # a data holder's passes carry the embedding and the loss; a peer the epoch does not place is nobody's relay
    assert [iteration_of(relays, schedule, it, {"b": 0.2, "c": 0.2, "d": 0.2, "h0": 9.0, "x": 9.0})
            for it in range(10, 13)] == [[]] * 3
    # an epoch's relays are not held against another epoch's of the same iteration
    other = Schedule(epoch=1, rules=PathRules(3, 3), placement=PLACEMENT, memory=dict.fromkeys(PLACEMENT, 2),
                     routes=())
    for it in (13, 14):
        iteration_of(relays, schedule, it, {"b": 0.2, "c": 0.2})
        assert iteration_of(relays, other, it, {"a": 0.9, "d": 0.9}) == []
    # per layer: a pass of stage 2's three layers takes half as long again as one of stage 1's two
    uneven = SlowRelays((2, 2, 3))
    assert [iteration_of(uneven, schedule, it, {"a": 0.2, "b": 0.2, "d": 0.2, "c": 0.45}) for it in range(3)] == \
        [[]] * 3


def report_paces(s: Scheduler, records: dict[str, PeerRecord], slow: set[str], t: float) -> list:
    """At `t`, with every peer's record fresh, every relay of the newest epoch reports the iteration in progress,
    those of `slow` last and at 8 times the seconds per pass of the others (as quick as they announced); the actions
    of the last report that asked for any."""
    assert published(s.observe(fresh(records), t)) == []
    actions: list = []
    layers = s.replanner.layers_per_stage
    for p in sorted((p for p, st in s.schedule.placement.items() if st > 0), key=lambda p: (p in slow, p)):
        honest = records[p].seconds_per_layer * layers[s.schedule.placement[p]] * (1 + BACKWARD_FACTOR) / 2
        out = s.handle(p, pace(p, honest * (8.0 if p in slow else 1.0), iteration=s.completed,
                               epoch=s.schedule.epoch), t)
        actions = out or actions
    return actions


def relay_events(caplog) -> list[dict]:
    return [getattr(r, EVENT_ATTR) for r in caplog.records if getattr(r, EVENT_ATTR, {}).get("event") ==
            "relay_benched"]


def test_a_slow_relay_with_a_stage_mate_is_benched_and_planned_around(records, caplog):
    """Slow in two iterations, it is told it is benched and the others are told to go around it; an epoch without
    it starts at the next iteration, its stage served by its mate. Its reports in another peer's name count for
    nothing."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    slow = next(p for p, st in first.placement.items() if st > 0 and len(first.stage_peers(st)) > 1)
    other = next(p for p, st in first.placement.items() if st > 0 and p != slow)
    commit(s, 1, now=100.0)
    assert report_paces(s, records, {slow}, 101.0) == []
    assert s.handle(slow, Pace(peer=other, iteration=1, epoch=first.epoch, operations=4, compute=9.0), 101.0) == []
    commit(s, 1, now=102.0)
    with caplog.at_level("WARNING"):
        actions = report_paces(s, records, {slow}, 103.0)
    told, in_progress = notices(actions), s.completed
    assert Benched(peer=slow, iteration=in_progress, seconds=BENCH) in told
    assert Gone(peers=(slow,), iteration=in_progress, epoch=first.epoch) in told
    (benched,) = published(actions)
    assert slow not in benched.placement and benched.meta["start_iteration"] == in_progress + 1
    assert slow not in s.liveness.declared_gone and s.slow.benched(103.0) == {slow}
    assert relay_events(caplog) == [{"event": "relay_benched", "peer": slow, "seconds": BENCH,
                                     "iteration": in_progress}]
    assert other not in s.slow.benched(103.0)


def test_a_slow_relay_last_of_its_stage_hands_it_to_a_peer_another_stage_can_spare(records):
    """Not announced gone (it serves the iteration in progress): the next epoch moves a peer of a stage with two to
    its stage, which takes its state over from it, as from a peer leaving."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    alone = next(p for p, st in first.placement.items() if st > 0 and len(first.stage_peers(st)) == 1)
    for t in (100.0, 102.0):
        commit(s, 1, now=t)
        actions = report_paces(s, records, {alone}, t + 1)
    told, in_progress = notices(actions), s.completed
    assert Benched(peer=alone, iteration=in_progress, seconds=BENCH) in told
    assert not any(isinstance(m, Gone) for m in told)
    (benched,) = published(actions)
    stage = first.placement[alone]
    assert alone not in benched.placement and benched.meta["start_iteration"] == in_progress + 1
    (mover,) = benched.stage_peers(stage)
    assert first.placement[mover] not in (0, stage) and benched.meta["handover"] == {mover: alone}
    commit(s, 1, now=104.0)  # the iteration in progress commits with it; nothing more is planned for it
    assert published(s.observe(fresh(records), 104.0)) == [] and s.schedule is benched


def test_a_slow_relay_stays_where_its_stage_would_be_left_unserved():
    """Seven peers on six stages: one peer on each later stage. The last peer of a stage, slow, is not benched while
    no stage can spare a peer to take it over."""
    records = dict(sorted(make_records().items())[:7])
    s = make_scheduler("skippipe")
    first = planned(s, records)
    slow = next(p for p, st in first.placement.items() if st > 0)
    for t in (100.0, 102.0, 104.0):
        commit(s, 1, now=t)
        assert report_paces(s, records, {slow}, t + 1) == []
    assert s.schedule is first and not s.slow.benched(106.0)


def test_a_run_configured_without_benches_benches_no_relay(records):
    config = make_config("skippipe", bench_seconds=0)
    s = Scheduler(config, model_of(config), "coordinator")
    first = planned(s, records)
    slow = next(p for p, st in first.placement.items() if st > 0 and len(first.stage_peers(st)) > 1)
    for t in (100.0, 102.0, 104.0):
        commit(s, 1, now=t)
        assert report_paces(s, records, {slow}, t + 1) == []
    assert slow in s.schedule.placement

