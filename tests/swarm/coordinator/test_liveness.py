"""Who the scheduler takes for alive: records seen within their lifetime, not leaving, not declared gone on
corroborated reports; a peer declared gone that asks to be placed again is taken back."""

from __future__ import annotations

import dataclasses

from swarm.constants import silent_after
from swarm.coordinator.liveness import (
    FIRST_REJOIN_COOLDOWN,
    MAX_REJOIN_COOLDOWN,
    REJOIN_COOLDOWN,
    UNREAD_HEARTBEATS,
    Liveness,
    rejoin_after,
)
from swarm.coordinator.pings import ping_timeout
from swarm.coordinator.unreachable_reports import OVERDUE_HEARTBEATS
from swarm.wire import PeerRecord, PeerState

HEARTBEAT = 2.0


def record(peer: str, state: PeerState = PeerState.ONLINE) -> PeerRecord:
    return PeerRecord(peer_id=peer, stage=1, seconds_per_layer=0.1, memory_slots=3, state=state)


def test_a_record_missing_from_one_read_counts_until_its_lifetime_is_over():
    live = Liveness(HEARTBEAT, exclude="coordinator")
    both = {p: (record(p), 0.5) for p in ("a", "b", "coordinator")}
    assert set(live.update(both, 0.0)) == {"a", "b"}  # the coordinator's own record is never a member
    only_a = {"a": (record("a"), 0.5)}
    assert set(live.update(only_a, silent_after(HEARTBEAT) - 0.1)) == {"a", "b"}  # one read missed it
    assert set(live.update(only_a, silent_after(HEARTBEAT) + 0.1)) == {"a"}
    assert live.seen_for("a", 10.0) == 10.0 and live.seen_for("never", 10.0) == 0.0


def test_a_leaving_peer_is_gone_at_once():
    live = Liveness(HEARTBEAT)
    live.update({"a": (record("a"), 0.5), "b": (record("b"), 0.5)}, 0.0)
    assert set(live.update({"a": (record("a", PeerState.LEAVING), 0.5), "b": (record("b"), 0.5)}, 1.0)) == {"b"}


def test_a_peer_that_left_and_joins_again_with_its_key_is_live_again():
    live = Liveness(HEARTBEAT)
    live.update({"a": (record("a", PeerState.JOINING), 0.5)}, 0.0)
    assert live.update({"a": (record("a", PeerState.LEAVING), 0.5)}, 1.0) == {}
    # a read still showing its joining record of before the leave (heartbeat 3 s old, the leave seen 2 s ago)
    assert live.update({"a": (record("a", PeerState.JOINING), 3.0)}, 3.0) == {}
    # its restarted process's record, written after the leave: a joiner afresh
    assert set(live.update({"a": (record("a", PeerState.JOINING), 0.5)}, 4.0)) == {"a"}
    assert live.seen_for("a", 5.0) == 1.0
    # it holds no stage's state until it has loaded one (placed, online): whatever places it next makes it a joiner
    assert live.stateless == {"a"}
    live.update({"a": (record("a", PeerState.JOINING), 0.5)}, 6.0)
    assert live.stateless == {"a"}
    live.update({"a": (record("a"), 0.5)}, 8.0)
    assert live.stateless == set()


def test_reports_convict_with_two_reporters_or_an_overdue_heartbeat_and_a_rejoin_is_taken_back():
    live = Liveness(HEARTBEAT)
    fresh = {p: (record(p), 0.5) for p in "abcd"}
    live.update(fresh, 0.0)
    live.report_unreachable("a", "d", 1.0)
    assert "d" in live.live(1.0) and live.reporters("d", 1.0) == {"a"}
    overdue = (OVERDUE_HEARTBEATS + 0.1) * HEARTBEAT
    live.update({**fresh, "d": (record("d"), overdue)}, 1.0)  # its heartbeat is overdue: corroborated
    assert "d" not in live.live(1.0) and "d" in live.declared_gone
    live.report_unreachable("b", "d", 1.2)  # a late report about a peer already gone does not declare it again
    assert live.reporters("d", 1.2) == set()
    rejoining = {**fresh, "d": (dataclasses.replace(record("d"), state=PeerState.JOINING), 0.5)}
    live.update(rejoining, 2.0)
    assert "d" not in live.live(2.0)  # alive after all and asks to be placed again: not at once...
    live.update(rejoining, 1.0 + FIRST_REJOIN_COOLDOWN)
    assert "d" in live.live(1.0 + FIRST_REJOIN_COOLDOWN)  # ...but once its (first, short) cool-down has passed
    live.report_unreachable("a", "c", 3.0)
    live.report_unreachable("b", "c", 3.0)  # two reporters: gone whatever its heartbeat says
    assert "c" not in live.live(3.0)


def test_a_peer_that_froze_just_after_writing_a_joining_record_is_not_taken_back_on_that_record():
    """Its last heartbeat before the freeze still said joining (it was being placed): that record, read again and
    again as it ages, is no request to be placed again; a record written after the verdict is."""
    live = Liveness(HEARTBEAT)
    fresh = {p: (record(p), 0.5) for p in "abc"}
    joining = dataclasses.replace(record("c"), state=PeerState.JOINING)
    live.update({**fresh, "c": (joining, 0.5)}, 0.0)  # written at -0.5, then c froze
    live.report_unreachable("a", "c", 2.0)
    live.report_unreachable("b", "c", 2.0)
    assert "c" in live.declared_gone
    for now in (2.0 + FIRST_REJOIN_COOLDOWN, 3.0 + FIRST_REJOIN_COOLDOWN):
        live.update({**fresh, "c": (joining, now + 0.5)}, now)  # the same record, older at each read
        assert "c" in live.declared_gone and "c" not in live.live(now)
    now = 4.0 + FIRST_REJOIN_COOLDOWN
    assert "c" in live.update({**fresh, "c": (joining, 0.5)}, now)  # a new one: alive after all, taken back


def test_a_heartbeat_ages_between_reads_so_a_silent_peer_reported_once_is_gone():
    live = Liveness(HEARTBEAT)
    live.update({p: (record(p), 0.5) for p in "abc"}, 0.0)  # c's heartbeat was fresh at the last read...
    live.report_unreachable("a", "c", 0.5)
    assert "c" in live.live(0.5)  # one reporter, and c's heartbeat is not overdue: not enough
    live.report_unreachable("a", "c", OVERDUE_HEARTBEATS * HEARTBEAT)  # no newer read since: overdue
    assert "c" in live.declared_gone
    assert "b" not in live.declared_gone


def test_a_peer_the_reads_miss_is_pinged_and_kept_while_it_answers_and_one_report_alone_does_not_convict_it():
    """A loaded DHT's reads missed live peers' records for minutes while other records came (a 20-peer churn run):
    the missing peer is pinged instead of timed out, its answers keep it live, and its heartbeat's age is unknown
    rather than counted on since it was last read (one report alone then convicted live peers by the dozen). A
    peer that does not answer expires with its record as before."""
    live = Liveness(HEARTBEAT, exclude="coordinator")
    live.update({p: (record(p), 0.5) for p in "abcd"}, 0.0)
    late = UNREAD_HEARTBEATS * HEARTBEAT + 0.1
    only = lambda *peers: {p: (record(p), 0.5) for p in peers}  # noqa: E731
    assert live.unread("abcd", 1.0) == [] and live.update(only("a", "b"), late)
    assert live.unread("abc", late) == ["c"]  # d is not placed: not asked
    live.report_unreachable("a", "c", OVERDUE_HEARTBEATS * HEARTBEAT + 0.5)  # its last-read age would be overdue
    assert "c" not in live.declared_gone  # but the reads, not c, may have failed: the scheduler's ping decides
    end = silent_after(HEARTBEAT) + 1.0
    live.answered("c", late + 0.5)
    live.answered("c", end - 1.0)  # asked again, answered again
    assert set(live.update(only("a", "b"), end)) == {"a", "b", "c"}  # live past its record's lifetime
    assert live.unread("abc", end) == [] and live.unread("abc", end - 1.0 + late) == ["c"]
    # a ping unanswered after a report convicts it; d, neither read nor heard from, expired with its record
    live.unanswered("c", end + 0.5)
    assert "c" in live.declared_gone and "d" not in live.live(end)


def test_a_peer_whose_record_ran_out_while_the_reads_stalled_is_asked_before_it_is_gone():
    """The DHT stalled for everyone (no read for longer than a record lives), then a read missed half the live
    peers: each is pinged and stays live while its ping is awaited; one that answers stays, one that does not goes
    and is not asked again."""
    live = Liveness(HEARTBEAT)
    live.update({p: (record(p), 0.5) for p in "abc"}, 0.0)
    t = silent_after(HEARTBEAT) + 5.0
    live.update({"a": (record("a"), 0.5)}, t)
    assert live.unread("bc", t) == ["b", "c"] and set(live.live(t)) == {"a"}
    live.asked("b", t)
    live.asked("c", t)
    assert set(live.live(t + 1.0)) == {"a", "b", "c"}  # their pings are awaited
    live.answered("b", t + 1.0)
    wait = ping_timeout(HEARTBEAT)
    live.unanswered("c", t + wait)
    assert set(live.live(t + wait + 0.1)) == {"a", "b"} and live.unread("bc", t + wait + 0.1) == []


def test_a_record_that_ran_out_while_the_scheduler_did_not_look_is_asked_first_and_one_asked_goes_with_it():
    """The scheduler's loop planned and published epochs for 8 s, and a few placed peers' records ran out meanwhile
    (a 20-peer churn run: 4 live relays of 18 taken for gone at once, re-placed as joiners): each is asked before it
    is gone. A peer the scheduler asked in time, that did not answer, goes with its record, not asked again."""
    live = Liveness(HEARTBEAT)
    live.update({p: (record(p), 0.5) for p in "abcd"}, 0.0)
    late = UNREAD_HEARTBEATS * HEARTBEAT + 0.1
    assert live.update({p: (record(p), 0.5) for p in "abc"}, late) and live.unread("abcd", late) == ["d"]
    live.asked("d", late)
    live.unanswered("d", late + ping_timeout(HEARTBEAT))  # d was asked in time and did not answer
    t = late + silent_after(HEARTBEAT) + 1.0  # the first look since: c's record ran out unseen, alone
    live.update({p: (record(p), 0.5) for p in "ab"}, t)
    assert live.unread("abcd", t) == ["c"]  # d is not asked again
    live.asked("c", t)
    assert set(live.live(t)) == {"a", "b", "c"}  # c stays while its ping is awaited; d is gone
    live.unanswered("c", t + ping_timeout(HEARTBEAT))
    assert set(live.live(t + ping_timeout(HEARTBEAT) + 0.1)) == {"a", "b"}


def test_a_new_message_from_a_peer_keeps_it_live_as_a_ping_answer_does_and_an_old_one_does_not():
    """A relay whose DHT stores time out still reports its pace after every commit: each report numbered above
    the last one seen from it is as good as a fresh record. A re-published old message is not; nor is a stranger's
    (no record: it is not noted at all)."""
    live = Liveness(HEARTBEAT)
    live.update({p: (record(p), 0.5) for p in "ab"}, 0.0)
    lifetime = silent_after(HEARTBEAT)
    live.heard_from("b", 7, lifetime - 1.0)
    live.heard_from("stranger", 1, lifetime - 1.0)
    live.update({"a": (record("a"), 0.5)}, lifetime + 1.0)
    assert set(live.live(lifetime + 1.0)) == {"a", "b"}  # heard from 2 s ago: live past its record's lifetime
    assert live.unread("ab", lifetime + 1.0) == []
    live.heard_from("b", 7, 2 * lifetime - 0.5)  # the same message again (a replay): no news
    live.heard_from("b", 3, 2 * lifetime - 0.5)
    assert set(live.live(2 * lifetime)) == {"a"}
    live.heard_from("b", 8, 2 * lifetime + 0.5)
    assert set(live.live(2 * lifetime + 0.5)) == {"a", "b"} and "stranger" not in live.live(lifetime)


def test_a_peer_declared_gone_again_and_again_waits_longer_each_time():
    live = Liveness(HEARTBEAT)
    fresh = {p: (record(p), 0.5) for p in "abc"}
    joining = {**fresh, "c": (dataclasses.replace(record("c"), state=PeerState.JOINING), 0.5)}
    now = 0.0
    live.update(fresh, now)
    for times in (1, 2, 3):
        live.report_unreachable("a", "c", now)
        live.report_unreachable("b", "c", now)  # two reporters: gone
        assert "c" in live.declared_gone
        wait = rejoin_after(times)
        assert "c" not in live.update(joining, now + wait - 1)
        assert "c" in live.update(joining, now + wait)
        now += wait
    assert rejoin_after(1) == FIRST_REJOIN_COOLDOWN < rejoin_after(2) == REJOIN_COOLDOWN
    assert rejoin_after(3) == 2 * REJOIN_COOLDOWN and rejoin_after(50) == MAX_REJOIN_COOLDOWN
