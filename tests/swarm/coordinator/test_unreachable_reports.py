"""Unreachable reports become a verdict only when corroborated, and only while they are recent."""

from __future__ import annotations

from swarm.coordinator.unreachable_reports import OVERDUE_HEARTBEATS, UnreachableReports


def test_one_reporter_needs_an_overdue_heartbeat_two_need_nothing_more():
    r = UnreachableReports(heartbeat=2.0)
    r.report("a", "x", now=0.0)
    r.report("x", "x", now=0.0)  # a peer's word about itself does not count
    assert r.gone({"x": 1.0}, now=0.5) == {}
    assert r.gone({"x": 4.5}, now=0.5) == {}  # one failed beat (a store that timed out) is not overdue yet
    assert r.gone({}, now=0.5) == {}  # no heartbeat known: its record expires on its own
    late = OVERDUE_HEARTBEATS * 2.0 + 0.5
    assert f"heartbeat is {late:.1f} s old" in r.gone({"x": late}, now=0.5)["x"]
    r.report("b", "x", now=1.0)
    assert "from 2 peers" in r.gone({"x": 0.1}, now=1.0)["x"]


def test_reports_lapse_after_three_heartbeats_and_a_gone_peers_reports_are_forgotten():
    r = UnreachableReports(heartbeat=2.0)
    r.report("a", "x", now=0.0)
    r.report("b", "x", now=5.0)
    assert r.reporters("x", now=6.5) == {"b"}  # a's report is 6.5 s old
    assert r.gone({"x": 0.1}, now=6.5) == {}
    r.report("a", "x", now=7.0)
    r.forget("a")  # a itself was declared gone: its word no longer counts
    assert r.gone({"x": 0.1}, now=7.0) == {}
    assert r.gone({"x": 0.1}, now=20.0) == {} and r.reporters("x", now=20.0) == set()
