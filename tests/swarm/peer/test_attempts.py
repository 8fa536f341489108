"""A peer's bookkeeping of microbatch attempts: which is current, which are over, what each carries."""

from __future__ import annotations

from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.peer.attempts import Attempts, Requeue, peers_to_avoid, requeued_route

ROUTE = Route(microbatch=0, origin="h0", stages=(1, 2), peers=("a1", "a2"))


def schedule() -> Schedule:
    rules = PathRules(num_stages=3, stages_per_path=3, max_swaps=0, max_swap_distance=1)
    placement = {"h0": 0, "a1": 1, "b1": 1, "a2": 2, "b2": 2}
    return Schedule(epoch=0, rules=rules, placement=placement, memory=dict.fromkeys(placement, 4), routes=(ROUTE,),
                    run_id="r")


def test_a_message_of_an_earlier_or_broken_attempt_is_stale():
    a = Attempts()
    assert not a.stale(0, 0, mine=False)
    assert a.end(0, 0) and not a.end(0, 0)  # acted on once
    assert a.stale(0, 0, mine=False) and a.is_over(0, 0)
    assert a.arrived(0, 1) and not a.arrived(0, 1) and a.current(0) == 1
    assert not a.stale(0, 1, mine=False) and a.stale(0, 0, mine=False)
    assert a.stale(0, 2, mine=True) and not a.stale(0, 2, mine=False)  # only the holder starts attempts


def test_the_counted_stages_travel_with_the_attempt():
    a = Attempts()
    assert a.counted(4) == frozenset()
    a.carry(4, (2, 3))
    assert a.counted(4) == {2, 3}
    a.begin(5, 1, frozenset({1}))
    assert a.current(5) == 1 and a.counted(5) == {1}


def test_a_report_is_disproved_only_when_the_accused_served_the_attempt_that_tests_it():
    a = Attempts()
    a.begin(0, 1, frozenset(), accused=("a1", "a2"))
    assert a.disproved_by(Route(microbatch=0, origin="h0", stages=(1, 2), peers=("b1", "a2"))) == ("a1", "a2", 1)
    assert a.disproved_by(ROUTE) is None  # asked once
    a.begin(1, 1, frozenset(), accused=("a1", "a2"))
    assert a.disproved_by(Route(microbatch=1, origin="h0", stages=(1, 2), peers=("b1", "b2"))) is None


def test_a_requeued_route_goes_around_the_gone_peer_and_counts_the_stages_its_backward_passed():
    report = Requeue(iteration=0, epoch=0, microbatch=0, attempt=0, gone="a1")
    new, counted = requeued_route(schedule(), ROUTE, report, frozenset(), loss_done=False, gone={"a1"})
    assert new is not None and new.peers == ("b1", "a2") and counted == frozenset()
    _, counted = requeued_route(schedule(), ROUTE, report, frozenset(), loss_done=True, gone={"a1"})
    assert counted == {2}  # the backward had passed stage 2 and died with a1
    ran = Requeue(iteration=0, epoch=0, microbatch=0, attempt=0, gone="a1", maybe_ran=True)
    _, counted = requeued_route(schedule(), ROUTE, ran, frozenset(), loss_done=True, gone={"a1"})
    assert counted == {1, 2}  # a1 may have run it before its send back failed


def test_a_relay_report_is_tested_by_going_around_the_reporter_next():
    report = Requeue(iteration=0, epoch=0, microbatch=0, attempt=0, gone="a2", reporter="a1")
    assert peers_to_avoid(report, "h0", ROUTE.peers) == [{"a2"}, {"a1"}]
    own = Requeue(iteration=0, epoch=0, microbatch=0, attempt=0, gone="a2")
    assert peers_to_avoid(own, "h0", ROUTE.peers) == [{"a2"}]
