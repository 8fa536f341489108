"""When epoch 0 is planned: once the swarm has settled, its links measured or waited for; a saved plan once its
peers are here (tests/swarm/coordinator/test_scheduler.py drives that part through the scheduler).
Driven through `FirstPlan.plan` with explicit times."""

from __future__ import annotations

import dataclasses

from scheduler.schedule import validate
from swarm.coordinator.first_plan import LINK_WAIT_SECONDS, SETTLE_SECONDS, FirstPlan
from swarm.coordinator.replanner import Replanner
from tests.swarm.coordinator.conftest import make_config, model_of


def first_plan(**kwargs) -> FirstPlan:
    config = make_config(**kwargs)
    return FirstPlan(config, Replanner(config, model_of(config)))


def test_it_plans_once_no_new_peer_came_for_the_settling_time(records):
    f = first_plan(min_peers=6)
    few = dict(sorted(records.items())[:5])
    assert f.plan(few, 0.0) is None and f.plan(few, 10.0) is None  # fewer than min_peers: never
    assert f.plan(records, 11.0) is None  # a newcomer restarts the settling clock
    assert f.plan(records, 11.0 + SETTLE_SECONDS / 2) is None
    schedule = f.plan(records, 11.0 + SETTLE_SECONDS)
    assert schedule is not None and schedule.epoch == 0 and schedule.meta["start_iteration"] == 0
    assert set(schedule.placement) == set(records)
    validate(schedule)


def test_a_known_peer_missing_from_a_read_does_not_restart_the_settling_clock(records):
    f = first_plan()
    assert f.plan(records, 0.0) is None
    flicker = dict(sorted(records.items())[1:])  # one record read just past its expiry, on a loaded machine
    assert f.plan(flicker, SETTLE_SECONDS / 2) is None
    schedule = f.plan(records, SETTLE_SECONDS)  # no peer is new: settled since 0.0
    assert schedule is not None and set(schedule.placement) == set(records)


def test_unmeasured_links_are_waited_for_then_planned_around(records):
    unprobed = sorted(records)[3]
    partial = {p: dataclasses.replace(r, links={} if p == unprobed else {q: v for q, v in r.links.items()
                                                                          if q != unprobed})
               for p, r in records.items()}  # nobody measured its links yet, in either direction
    f = first_plan()
    assert f.plan(partial, 0.0) is None
    assert f.plan(partial, SETTLE_SECONDS) is None and f.plan(partial, LINK_WAIT_SECONDS - 1) is None
    schedule = f.plan(partial, LINK_WAIT_SECONDS)
    assert schedule is not None and unprobed in schedule.placement
    # measured meanwhile: planned as soon as the swarm has settled
    f = first_plan()
    assert f.plan(partial, 0.0) is None and f.plan(records, SETTLE_SECONDS) is not None

