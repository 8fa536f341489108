"""A link on the paths that slowed (or recovered) since the plan has the paths re-planned around it where that pays."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from scheduler.costs import CostTables, tables_to_dict
from scheduler.paths import PathRules
from scheduler.schedule import Route, Schedule
from swarm.coordinator.link_drift import LinkDrift, busiest_link, crossings, hops
from swarm.events import EVENT_ATTR
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord
from tests.swarm.coordinator.conftest import make_config, make_records, make_scheduler
from tests.swarm.coordinator.test_measured_speeds import near
from tests.swarm.coordinator.test_scheduler import commit, fresh, planned, published

IDS = ("h", "a", "b")


def tables(message: dict[tuple[str, str], float]) -> CostTables:
    """Three peers' tables: messages of 0.01 s but those of `message` (both ways)."""
    m = np.full((3, 3), 0.01)
    np.fill_diagonal(m, 0.0)
    for (p, q), t in message.items():
        m[IDS.index(p), IDS.index(q)] = m[IDS.index(q), IDS.index(p)] = t
    return CostTables(ids=IDS, forward=np.full((3, 3), 0.1), message=m, memory=np.full(3, 2))


def epoch(number: int, planned_on: CostTables, predicted: float = 10.0) -> Schedule:
    """One path h -> a -> b -> h, planned on `planned_on`, its iteration `predicted` seconds."""
    return Schedule(epoch=number, rules=PathRules(3, 3), placement={"h": 0, "a": 1, "b": 2},
                    memory=dict.fromkeys(IDS, 2), routes=(Route(0, "h", (1, 2), ("a", "b")),),
                    predicted_iteration_seconds=predicted, meta={"costs": tables_to_dict(planned_on)})


def test_a_hop_drifts_once_its_message_time_moved_both_far_and_by_a_share_of_the_iteration():
    # activations one way, gradients the other
    assert list(hops(epoch(0, tables({})))) == [("h", "a"), ("a", "h"), ("a", "b"), ("b", "a"), ("b", "h"),
                                                 ("h", "b")]
    twice = dataclasses.replace(epoch(0, tables({})), routes=(Route(0, "h", (1, 2), ("a", "b")),
                                                               Route(1, "h", (1,), ("a",))))
    assert crossings(twice) == {("a", "h"): 6, ("a", "b"): 2, ("b", "h"): 2} and busiest_link(twice) == ("a", "h")
    links, first = LinkDrift(), epoch(0, tables({}))
    assert links.drifted(first, tables({})) == {}
    # 25x and 0.24 s more, past 2% of a 10-s iteration (0.2 s)
    assert links.drifted(first, tables({("a", "b"): 0.25})) == {"a->b": (0.01, 0.25), "b->a": (0.01, 0.25)}
    assert links.drifted(first, tables({("a", "b"): 0.15})) == {}  # 15x, but 0.14 s of a 10-s iteration
    gradients = tables({})  # only the gradients' direction slowed (b's upload to a)
    gradients.message[IDS.index("b"), IDS.index("a")] = 0.25
    assert links.drifted(first, gradients) == {"b->a": (0.01, 0.25)}
    # weighed: the slow link is the baseline now; it drifts again only when it moves again, recovering included
    links.weighed(tables({("a", "b"): 0.5}))
    assert links.drifted(first, tables({("a", "b"): 0.6})) == {}
    assert links.drifted(first, tables({})) == {"a->b": (0.5, 0.01), "b->a": (0.5, 0.01)}
    # a new epoch is measured from what it was planned on; one without costs has nothing to compare
    slow = tables({("b", "h"): 1.0})
    assert links.drifted(epoch(1, slow), slow) == {}
    assert links.drifted(epoch(1, slow), tables({})) == {"b->h": (1.0, 0.01), "h->b": (1.0, 0.01)}
    bare = dataclasses.replace(epoch(2, slow), meta={})
    assert links.drifted(bare, tables({})) == {}


def slowed(records: dict[str, PeerRecord], a: str, b: str, latency: float, bandwidth: float) -> dict[str, PeerRecord]:
    """`records` with the link between `a` and `b` measured at `latency` and `bandwidth`, both ways."""
    out = dict(records)
    for p, q in ((a, b), (b, a)):
        out[p] = dataclasses.replace(out[p], links={**out[p].links, q: (latency, bandwidth)})
    return out


def test_a_link_that_slowed_under_the_paths_has_them_replanned_around_it_from_the_next_iteration(caplog):
    """Fast links all round, then the probes find the busiest relay-to-relay hop at 0.5 s: the commit after re-plans
    the paths on the same placement, crossing that hop less; the same link after that re-plans nothing."""
    records = near(make_records())
    s = make_scheduler("skippipe")
    first = planned(s, records)
    (a, b), _ = Counter(h for h in hops(first) if first.placement[h[0]] and first.placement[h[1]]).most_common(1)[0]
    commit(s, 1, now=100.0)
    records = slowed(records, a, b, latency=0.5, bandwidth=1e9)
    assert published(s.observe(fresh(records), 101.0)) == []  # a link is weighed after a commit
    with caplog.at_level("INFO"):
        (replanned,) = published(commit(s, 1, now=102.0))
    assert replanned.placement == first.placement and replanned.meta["start_iteration"] == s.completed + 1
    before, after = Counter(hops(first)), Counter(hops(replanned))
    assert after[a, b] + after[b, a] < before[a, b] + before[b, a]
    (drift,) = [getattr(r, EVENT_ATTR) for r in caplog.records
                if getattr(r, EVENT_ATTR, {}).get("event") == "costs_drifted"]
    assert drift["peers"] == {} and f"{a}->{b}" in drift["links"] and drift["replanned"] is True
    for t in (103.0, 105.0):
        s.observe(fresh(records), t)
        assert published(commit(s, 1, now=t + 1)) == []
    assert s.schedule is replanned


def test_with_link_drift_off_a_slowed_link_replans_nothing_and_the_setting_travels_in_the_spec():
    records = near(make_records())
    s = make_scheduler("skippipe", link_drift=False)
    first = planned(s, records)
    (a, b), _ = Counter(h for h in hops(first) if first.placement[h[0]] and first.placement[h[1]]).most_common(1)[0]
    commit(s, 1, now=100.0)
    s.observe(fresh(slowed(records, a, b, latency=0.5, bandwidth=1e9)), 101.0)
    assert published(commit(s, 1, now=102.0)) == [] and s.schedule is first
    off = make_config("skippipe", link_drift=False)
    assert RunConfig.from_spec(off.to_spec(coordinator="c", vocab_size=512))[0].link_drift is False
    assert "link_drift" not in make_config().to_spec(coordinator="c", vocab_size=512).hyperparameters
    with pytest.raises(ValueError, match="link_drift"):
        make_config("skippipe", link_drift=1)
