"""Slow peers' shares and benches outlive their scheduler: a successor goes on from what the newest epoch says."""

from __future__ import annotations

import dataclasses

from swarm.coordinator.benches import BENCH
from swarm.coordinator.slow_peers import SlowPeers
from swarm.wire import PeerState
from tests.swarm.coordinator.conftest import make_scheduler
from tests.swarm.coordinator.test_benches import late_twice
from tests.swarm.coordinator.test_scheduler import commit, fresh, planned, published

SUCCESSOR_CLOCK = 5000.0
"""A successor's monotonic clock is another machine's: nothing it takes over may be a time of its predecessor's."""


def test_a_successor_keeps_a_slow_holders_share_then_its_bench_and_places_it_after_the_time_left(records):
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 1, now=100.0)
    slow = first.data_holders[0]
    _, t = late_twice(s, records, slow, 100.0)  # halved: 4 -> 2 microbatches
    assert s.schedule.meta["slow"] == {"shares": {slow: 0.5}}
    heir = make_scheduler("skippipe")
    (resumed,) = published(heir.resume(s.epochs.all, s.completed, fresh(records), SUCCESSOR_CLOCK))
    assert len(resumed.routes_from(slow)) == 2 and heir.slow.holders.shares.share(slow) == 0.5

    for _ in range(2):
        _, t = late_twice(s, records, slow, t)  # 2 -> 1, then benched
    assert slow not in s.schedule.placement and s.schedule.meta["slow"] == {"benched": {slow: [BENCH, 1]}}
    commit(s, 1, now=t + 100)  # the iteration in progress commits without it, 100 s into its bench
    records[slow] = dataclasses.replace(records[slow], state=PeerState.JOINING)  # it asks to be placed again
    heir = make_scheduler("skippipe")
    (resumed,) = published(heir.resume(s.epochs.all, s.completed, fresh(records), SUCCESSOR_CLOCK))
    assert slow not in resumed.placement  # the bench goes on: it is not placed at once as a joiner
    assert published(heir.observe(fresh(records), SUCCESSOR_CLOCK + BENCH - 1)) == []
    (back,) = published(heir.observe(fresh(records), SUCCESSOR_CLOCK + BENCH + 1))
    assert slow in back.placement and heir.slow.holders.shares.share(slow) == 1.0
    assert heir.slow.benches.bench(slow, SUCCESSOR_CLOCK + 1000) == 2 * BENCH  # its second bench, as counted before


def test_a_predecessors_malformed_slow_peers_are_dropped_entry_by_entry(caplog):
    slow = SlowPeers(4, BENCH, (2, 2, 2))
    with caplog.at_level("WARNING"):
        slow.restore({"shares": {"a": 0.5, "b": 7.0, "c": 0.1, "d": "0.5"},
                      "benched": {"e": [10.0, 1], "f": [1e12, 1], "g": "soon", "h": [5.0, True],
                                  "i": [float("nan"), 2], "": [5.0, 1]}}, now=0.0)
    assert slow.holders.shares.slowed == {"a": 0.5} and slow.benched(9.0) == {"e"} and slow.benched(10.0) == set()
    assert len(caplog.records) == 1 and "'b'" in caplog.records[0].getMessage()
    for garbage in ([1, 2], {"shares": [0.5], "benched": 3}, None):
        SlowPeers(4, BENCH, (2, 2, 2)).restore(garbage, now=0.0)  # nothing taken, nothing raised
