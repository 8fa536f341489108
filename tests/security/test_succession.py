"""The scheduler's successor is named by the scheduler, in its signed schedule; it is not the smallest peer id.

Electing the smallest live peer id let anyone who ground a key with a small id take the role over when the
coordinator died; the list is in the schedule, which only the scheduler signs (see test_dht_records.py). A peer
that took the role from a coordinator alive after all gives it back: one scheduler per run.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from swarm.control.messages import Alive, Done
from swarm.coordinator.actions import PublishSchedule
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.peer.succession import Succession
from swarm.wire import PeerState
from tests.swarm.coordinator.conftest import make_records, make_scheduler, read_after_expiry


def test_the_successor_is_the_first_live_peer_the_scheduler_named():
    records = make_records()
    s = make_scheduler()
    fresh = {p: (r, 0.5) for p, r in records.items() if p != "peer-00"}
    s.observe(fresh, 0.0)
    s.observe({**fresh, "peer-00": (records["peer-00"], 0.5)}, 1.0)  # the smallest id, seen last
    (action,) = [a for a in s.observe({p: (r, 0.5) for p, r in records.items()}, 60.0)
                 if isinstance(a, PublishSchedule)]
    schedule = action.schedule
    named = schedule.meta["successors"]
    assert sorted(named) == sorted(schedule.placement) and named[-1] == "peer-00"  # oldest members first

    follower = ScheduleFollower(records=None, coordinator="coordinator", heartbeat=1.0)
    follower.schedule = schedule
    succession = Succession("peer-05", None, None, follower, make_role=None, iteration=lambda: 0)
    assert succession.successor(records) == named[0] != "peer-00"
    live = {p: r for p, r in records.items() if p != named[0]}
    assert succession.successor(live) == named[1]  # the first one died too: the next in line
    assert succession.successor({"stranger": records["peer-00"]}) is None  # nobody named is alive

    # the list keeps its order across epochs: a joiner goes to its end
    for h in schedule.data_holders:
        s.handle(h, Done(peer=h, iteration=0, epoch=0, loss_sum=1.0, losses=1, tokens=1, started=0.0, finished=1.0),
                 61.0)
    survivors = {p: r for p, r in records.items() if p != named[0]}
    (later,) = [a.schedule for a in read_after_expiry(s, survivors, 120.0) if isinstance(a, PublishSchedule)]
    assert later.meta["successors"] == [p for p in named if p in later.placement]


class RoleSeen:
    """What the succession asks of the scheduler role it holds (`SchedulerRole`'s calls), recorded."""

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.calls, self.done = kwargs, [], False

    def resume(self, schedules, completed, positions) -> None:
        self.calls.append(("resume", completed))

    def tick(self) -> None:
        time.sleep(0.01)

    def finish(self, stop) -> None:
        self.calls.append("finish")

    def close(self) -> None:
        self.calls.append("close")


def test_a_peer_that_took_the_role_from_a_live_coordinator_gives_it_back_at_its_news():
    roles: list[RoleSeen] = []
    follower = ScheduleFollower(records=None, coordinator="coordinator", heartbeat=1.0)
    succession = Succession("peer-05", None, None, follower, iteration=lambda: 4,
                            make_role=lambda **kw: roles.append(RoleSeen(**kw)) or roles[-1])
    follower.scheduler = "peer-05"  # its watch took the coordinator for dead (its record went unread)
    stop = threading.Event()
    try:
        assert succession.take_role(stop) and not succession.take_role(stop)  # one role at a time
        end = time.monotonic() + 10
        while not roles or not roles[0].calls:
            assert time.monotonic() < end
            time.sleep(0.01)
        assert roles[0].calls == [("resume", 4)] and roles[0].kwargs == {"ends_run_on_stop": False}
        follower.on_message("coordinator", Alive(epoch=0, iteration=5), seqno=77)  # alive, and not behind
        assert follower.scheduler == "coordinator"
        while succession.role is not None:
            assert time.monotonic() < end, "the role was not given back"
            time.sleep(0.01)
        assert roles[0].calls == [("resume", 4), "close"]  # no 'finished': the run goes on, under the coordinator
        follower.scheduler = "peer-05"  # should the coordinator die for real later, the role can be taken again
        assert succession.take_role(stop)
        while len(roles) < 2:
            assert time.monotonic() < end
            time.sleep(0.01)
    finally:
        stop.set()


def test_the_records_a_peer_takes_leave_out_leaving_and_draining_peers():
    """What a joiner reads after its admission (and the watch reads each heartbeat) is whom it probes and links to:
    a peer leaving or draining is not among them."""
    records = make_records()
    leaving, draining = sorted(records)[:2]
    records[leaving] = dataclasses.replace(records[leaving], state=PeerState.LEAVING)
    records[draining] = dataclasses.replace(records[draining], state=PeerState.DRAINING)
    follower = ScheduleFollower(records=None, coordinator="coordinator", heartbeat=1.0)
    succession = Succession("peer-05", None, None, follower, make_role=None, iteration=lambda: 0)
    assert succession.announced is None
    live = succession.take_records(records)
    assert live is succession.announced and set(live) == set(records) - {leaving, draining}
