"""The scheduler's successor is named by the scheduler, in its signed schedule; it is not the smallest peer id.

Electing the smallest live peer id let anyone who ground a key with a small id take the role over when the
coordinator died; the list is in the schedule, which only the scheduler signs (see test_dht_records.py).
"""

from __future__ import annotations

from swarm.control.messages import Done
from swarm.coordinator.actions import PublishSchedule
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.peer.succession import Succession
from tests.swarm.coordinator.conftest import make_records, make_scheduler


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
    survivors = {p: (r, 0.5) for p, r in records.items() if p != named[0]}
    (later,) = [a.schedule for a in s.observe(survivors, 120.0) if isinstance(a, PublishSchedule)]
    assert later.meta["successors"] == [p for p in named if p in later.placement]
