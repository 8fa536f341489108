"""A data holder whose Done is late against the others' is pinged by the scheduler: declared gone when it does not
answer (a frozen host), well before its record expires; waited for when it does (a slow one)."""

from __future__ import annotations

from swarm.control.messages import Commit, Done, Ping, Pong
from swarm.coordinator.actions import Announce, PublishSchedule
from swarm.coordinator.late_holders import LATE_FLOOR, LateHolders
from swarm.coordinator.scheduler import Scheduler
from tests.swarm.coordinator.conftest import make_scheduler


def pings(actions: list) -> list[Ping]:
    return [a.message for a in actions if isinstance(a, Announce) and isinstance(a.message, Ping)]


def test_a_holder_is_late_once_half_reported_and_the_median_is_well_past():
    late = LateHolders()
    late.began(100.0)
    holders = ["a", "b", "c", "d"]
    late.done("a", 3, 0, 108.0)
    assert late.late(3, 0, holders, 130.0) == []  # one of four reported: nobody to compare with yet
    late.done("b", 3, 0, 110.0)
    late.done("a", 3, 0, 111.0)  # a second report of one holder does not move its time
    # median 108 s, 8 s into the iteration: late past 108 + max(2, 4) = 112 s
    assert late.late(3, 0, holders, 111.9) == []
    assert late.late(3, 1, holders, 115.0) == []  # another epoch: nobody reported under it
    assert late.late(3, 0, holders, 112.0) == ["c", "d"]
    assert late.late(3, 0, holders, 120.0) == []  # asked once per iteration and epoch
    late.committed(3)
    late.began(121.0)
    late.done("a", 4, 0, 122.0)
    late.done("b", 4, 0, 122.5)
    assert late.late(4, 0, holders, 122.5 + LATE_FLOOR) == ["c", "d"]  # a short iteration: the floor


def read(s: Scheduler, records, now: float) -> None:
    """A read of the records at `now`, every heartbeat fresh (a frozen host's last record is still alive)."""
    s.observe({p: (r, 0.5) for p, r in records.items()}, now)


def planned_and_running(records) -> tuple[Scheduler, list[str], float]:
    """A scheduler whose first epoch is planned and whose first iteration committed at 10 s; its holders."""
    s = make_scheduler()
    s.observe({p: (r, 0.5) for p, r in records.items()}, 0.0)
    (schedule,) = [a.schedule for a in s.observe({p: (r, 0.5) for p, r in records.items()}, 5.0)
                   if isinstance(a, PublishSchedule)]
    for h in schedule.data_holders:
        s.handle(h, Done(peer=h, iteration=0, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=5.0,
                         finished=10.0), 10.0)
    assert s.completed == 1
    s.observe({p: (r, 0.5) for p, r in records.items()}, 10.0)
    return s, list(schedule.data_holders), 10.0


def report_all_but(s: Scheduler, holders: list[str], silent: str, now: float) -> None:
    for h in holders:
        if h != silent:
            assert not [a for a in s.handle(h, Done(peer=h, iteration=1, epoch=0, loss_sum=2.0, losses=4, tokens=256,
                                                    started=10.0, finished=now), now) if isinstance(a.message, Commit)]


def test_a_frozen_holder_is_declared_gone_on_its_late_done_and_an_unanswered_ping(records):
    s, holders, began = planned_and_running(records)
    frozen = holders[-1]
    report_all_but(s, holders, frozen, began + 8.0)
    assert pings(s.check_pings(began + 8.0 + 3.9)) == []  # median at 8 s: late past 8 + 4 s
    read(s, records, began + 11.9)
    (ping,) = pings(s.check_pings(began + 12.0))
    assert ping.peer == frozen
    assert pings(s.check_pings(began + 13.0)) == []  # asked once
    assert frozen not in s.liveness.declared_gone  # the ping may still be answered
    actions = s.check_pings(began + 12.0 + s.suspicions.pings.timeout)
    assert frozen in s.liveness.declared_gone  # its heartbeat was fresh at the last read: the ping decided it
    commits = [a.message for a in actions if isinstance(a, Announce) and isinstance(a.message, Commit)]
    replans = [a.schedule for a in actions if isinstance(a, PublishSchedule)]
    assert (commits and frozen in commits[0].left_out) or (replans and frozen not in replans[0].placement)


def test_a_slow_holder_that_answers_the_ping_is_waited_for(records):
    s, holders, began = planned_and_running(records)
    slow = holders[-1]
    report_all_but(s, holders, slow, began + 8.0)
    read(s, records, began + 11.9)
    (ping,) = pings(s.check_pings(began + 12.0))
    s.handle(slow, Pong(nonce=ping.nonce), began + 13.0)
    read(s, records, began + 19.9)
    assert not [a for a in s.check_pings(began + 20.0) if isinstance(a, PublishSchedule)]
    assert slow not in s.liveness.declared_gone and s.completed == 1
    s.handle(slow, Done(peer=slow, iteration=1, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=10.0,
                        finished=30.0), began + 20.0)
    assert s.completed == 2
