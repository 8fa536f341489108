"""The scheduler pings a peer that one peer reported unreachable: an unanswered ping is its own witness (the peer
is declared gone while its heartbeat is still fresh), an answer from that peer says it is alive (an overdue
heartbeat then does not convict it), and nobody else can answer for it."""

from __future__ import annotations

from swarm.control.messages import Ping, Pong, Unreachable
from swarm.coordinator.actions import Announce, PublishSchedule
from swarm.coordinator.pings import PING_CAP, PING_FLOOR, Pings, ping_timeout
from swarm.coordinator.unreachable_reports import OVERDUE_HEARTBEATS
from swarm.events import EVENT_ATTR
from tests.swarm.coordinator.conftest import make_scheduler


def pings(actions: list) -> list[Ping]:
    return [a.message for a in actions if isinstance(a, Announce) and isinstance(a.message, Ping)]


def first_plan(s, records):
    s.observe({p: (r, 0.5) for p, r in records.items()}, 0.0)
    (schedule,) = [a.schedule for a in s.observe({p: (r, 0.5) for p, r in records.items()}, 5.0)
                   if isinstance(a, PublishSchedule)]
    return schedule


def test_one_ping_per_peer_in_flight_answered_only_by_that_peer_with_its_nonce():
    p = Pings(timeout=3.0)
    ping = p.send("x", now=0.0)
    assert ping is not None and ping.peer == "x"
    assert p.send("x", now=1.0) is None  # one in flight: more reports do not make more pings
    assert not p.answer("y", ping.nonce)  # another peer cannot answer for it
    assert not p.answer("x", ping.nonce ^ 1)
    assert p.answer("x", ping.nonce) and not p.answer("x", ping.nonce)  # once
    late = p.send("z", now=10.0)
    assert p.unanswered(12.9) == [] and p.unanswered(13.0) == ["z"] and p.unanswered(20.0) == []
    assert not p.answer("z", late.nonce)  # too late: it already counted as unanswered
    assert ping_timeout(1.0) == PING_FLOOR and ping_timeout(4.0) == 4.0 and ping_timeout(15.0) == PING_CAP


def test_a_peer_that_does_not_answer_is_declared_gone_before_its_heartbeat_is_overdue(records):
    s = make_scheduler()
    first = first_plan(s, records)
    reporter, target = [p for p, st in first.placement.items() if st != 0][:2]
    ages = {p: (r, 0.5) for p, r in records.items()}
    s.observe(ages, 6.0)
    (ping,) = pings(s.handle(reporter, Unreachable(peer=target), 6.0))
    assert ping.peer == target
    assert pings(s.handle(reporter, Unreachable(peer=target), 6.5)) == []
    s.check_pings(6.0 + s.suspicions.pings.timeout - 0.1)
    assert target not in s.liveness.declared_gone  # one report, and the ping may still be answered
    (replan,) = [a.schedule for a in s.check_pings(6.0 + s.suspicions.pings.timeout) if isinstance(a, PublishSchedule)]
    assert target in s.liveness.declared_gone  # its heartbeat (0.5 s old at the last read) is not overdue
    assert target not in replan.placement  # re-planned at once, not at the next read of the records
    assert not [a for a in s.observe(ages, 10.0) if isinstance(a, PublishSchedule)]
    assert pings(s.handle(reporter, Unreachable(peer=target), 10.5)) == []  # gone: nothing more to ask


def test_a_death_declared_while_no_read_comes_drops_that_peer_alone(records):
    """A declaration re-plans without waiting for a read of the records; when reads have stalled (a loaded DHT),
    the placed peers whose records merely aged since the last one stay placed (the reads judge them, pinging first)."""
    from swarm.constants import silent_after

    s = make_scheduler()
    first = first_plan(s, records)
    reporter, target = [p for p, st in first.placement.items() if st != 0][:2]
    s.observe({p: (r, 0.5) for p, r in records.items()}, 6.0)
    later = 6.0 + silent_after(s.config.heartbeat) + 1.0  # no read since: every record has outlived its lifetime
    s.handle(reporter, Unreachable(peer=target), later)  # a report, and its heartbeat overdue as last read
    assert target in s.liveness.declared_gone
    (replan,) = [a.schedule for a in s.check_pings(later) if isinstance(a, PublishSchedule)]
    assert set(replan.placement) == set(first.placement) - {target}
    assert not s.check_pings(later + 0.1)  # once


def test_a_peer_that_answers_is_kept_even_when_its_heartbeat_is_overdue(records):
    s = make_scheduler()
    first = first_plan(s, records)
    reporter, target = [p for p, st in first.placement.items() if st != 0][:2]
    s.observe({p: (r, 0.5) for p, r in records.items()}, 6.0)
    (ping,) = pings(s.handle(reporter, Unreachable(peer=target), 6.0))
    s.handle(reporter, Pong(nonce=ping.nonce), 6.2)  # the reporter cannot answer for it
    s.handle(target, Pong(nonce=ping.nonce ^ 1), 6.3)  # nor can it with another nonce
    s.check_pings(6.0 + s.suspicions.pings.timeout)
    assert target in s.liveness.declared_gone
    s = make_scheduler()
    first_plan(s, records)
    s.observe({p: (r, 0.5) for p, r in records.items()}, 6.0)
    (ping,) = pings(s.handle(reporter, Unreachable(peer=target), 6.0))
    s.handle(target, Pong(nonce=ping.nonce), 6.5)  # alive
    s.check_pings(6.0 + s.suspicions.pings.timeout)
    overdue = (OVERDUE_HEARTBEATS + 0.5) * s.config.heartbeat
    s.observe({**{p: (r, 0.5) for p, r in records.items()}, target: (records[target], overdue)}, 7.0)
    assert target not in s.liveness.declared_gone  # its DHT store is slow, but it answered: as good as a beat
    (again,) = pings(s.handle(reporter, Unreachable(peer=target), 7.5))  # a new report: asked again
    s.handle(target, Pong(nonce=again.nonce), 8.0)
    s.check_pings(7.5 + s.suspicions.pings.timeout)
    assert target not in s.liveness.declared_gone
    s.observe({**{p: (r, 0.5) for p, r in records.items()}, target: (records[target], overdue + 12.0)}, 20.0)
    assert pings(s.handle(reporter, Unreachable(peer=target), 20.0)) == []  # it stopped answering, and beating:
    assert target in s.liveness.declared_gone  # its last answer is as old as an overdue heartbeat by now


def test_a_placed_peer_the_reads_miss_is_pinged_and_kept_while_it_answers(records):
    """The scheduler's reads stop showing a live peer's record (a loaded DHT): it is pinged before its record's
    lifetime is out, and while it answers it stays placed; one that does not answer is re-planned without."""
    from swarm.constants import silent_after

    s = make_scheduler()
    first = first_plan(s, records)
    quiet, silent = [p for p, st in first.placement.items() if st != 0][:2]
    read = {p: (r, 0.5) for p, r in records.items() if p not in (quiet, silent)}
    heartbeat = s.config.heartbeat
    t = 5.0
    asked: list[Ping] = []
    while t < 5.0 + 2 * silent_after(heartbeat):
        t += heartbeat / 2
        actions = s.observe(read, t)
        for ping in pings(actions):
            asked.append(ping)
            if ping.peer == quiet:
                s.handle(quiet, Pong(nonce=ping.nonce), t + 0.2)
        s.check_pings(t)
        if t < 5.0 + silent_after(heartbeat) - 0.5:
            assert not [a for a in actions if isinstance(a, PublishSchedule)]  # nobody dropped yet
    assert {p.peer for p in asked} == {quiet, silent} and sum(p.peer == quiet for p in asked) >= 2
    newest = s.schedule
    assert quiet in newest.placement and silent not in newest.placement


def test_a_peer_whose_record_runs_out_while_a_ping_for_a_report_is_in_flight_is_asked_by_that_ping(records):
    """The reads stalled after one that missed the peer's record (its age unknown: a report alone does not convict
    it), a report about it sent it a ping, and the next read finds its record run out: that ping asks it, and its
    answer keeps it placed (a second ping cannot be sent while one is in flight)."""
    from swarm.constants import silent_after

    s = make_scheduler()
    first = first_plan(s, records)
    reporter, target = [p for p, st in first.placement.items() if st != 0][:2]
    s.observe({p: (r, 0.5) for p, r in records.items()}, 6.0)
    missed = {p: (r, 0.5) for p, r in records.items() if p != target}
    s.observe(missed, 7.0)
    ran_out = 6.0 + silent_after(s.config.heartbeat) + 0.5
    (ping,) = pings(s.handle(reporter, Unreachable(peer=target), ran_out - 2.0))
    actions = s.observe(missed, ran_out)
    assert not [a for a in actions if isinstance(a, PublishSchedule)]  # its ping is awaited
    s.handle(target, Pong(nonce=ping.nonce), ran_out + 0.5)
    s.check_pings(ran_out + 0.5)
    assert not [a for a in s.observe(missed, ran_out + 1.0) if isinstance(a, PublishSchedule)]
    assert target in s.schedule.placement and target not in s.liveness.declared_gone


def test_pings_half_of_the_swarm_leaves_unanswered_at_once_are_asked_again_before_they_count(records, caplog):
    """So many silences at once are more likely the scheduler's own (its host or gossip stalled) than so many deaths:
    each peer is asked once more, and one that answers the second ping stays; a lone silence counts at once (above)."""
    s = make_scheduler()
    first = first_plan(s, records)
    relays = [p for p, st in first.placement.items() if st != 0]
    reporter, targets = relays[0], relays[1:7]  # 6 of 12 placed peers
    s.observe({p: (r, 0.5) for p, r in records.items()}, 6.0)
    for target in targets:
        assert len(pings(s.handle(reporter, Unreachable(peer=target), 6.0))) == 1
    caplog.set_level("WARNING")
    again = pings(s.check_pings(6.0 + s.suspicions.pings.timeout))
    assert {p.peer for p in again} == set(targets) and not s.liveness.declared_gone & set(targets)
    (repeated,) = [getattr(r, EVENT_ATTR) for r in caplog.records
                   if getattr(r, EVENT_ATTR, {}).get("event") == "pings_repeated"]
    assert repeated["peers"] == sorted(targets) and repeated["placed"] == len(first.placement)
    answering = again[0]
    s.handle(answering.peer, Pong(nonce=answering.nonce), 7.0 + s.suspicions.pings.timeout)
    assert pings(s.check_pings(6.0 + 2 * s.suspicions.pings.timeout)) == []  # asked once more, not again
    assert s.liveness.declared_gone & set(targets) == set(targets) - {answering.peer}
