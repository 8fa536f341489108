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
    assert r.gone({"x": late}, now=0.5)["x"][0] == "heartbeat"
    r.report("b", "x", now=1.0)
    assert r.gone({"x": 0.1}, now=1.0)["x"][0] == "reporters"


def test_one_reporter_and_an_unanswered_ping_convict_an_answer_counts_as_a_heartbeat():
    r = UnreachableReports(heartbeat=2.0)
    r.unanswered("x", now=0.0)  # a ping that went unanswered before this report was made does not count
    r.report("a", "x", now=1.0)
    assert r.gone({"x": 0.1}, now=1.0) == {}
    r.unanswered("x", now=4.0)
    assert r.gone({"x": 0.1}, now=4.0)["x"][0] == "ping"
    r.answered("x", now=4.5)  # it answers a later ping: alive after all
    assert r.gone({"x": 0.1}, now=4.5) == {}
    assert r.gone({"x": 20.0}, now=5.0) == {}  # its DHT is slow, but its answer is half a second old
    r.report("a", "x", now=9.0)
    assert r.gone({"x": 20.0}, now=4.5 + OVERDUE_HEARTBEATS * 2.0 + 0.1)["x"][0] == "heartbeat"


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
