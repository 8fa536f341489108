"""ControlRouter: each control message reaches the component that handles it, only from a sender that may send
it; a malformed one is dropped with an event; the peer's own scheduler role sees everything."""

from __future__ import annotations

import logging
import time

from hivemind.utils import get_dht_time

from swarm.control.gossip import GossipMessage
from swarm.control.membership import MembershipCert
from swarm.control.messages import Admitted, Benched, Broken, NotDialable, SitOut, as_gossip
from swarm.events import EVENT_ATTR
from swarm.peer.attempts import Requeue
from swarm.peer.control_router import ControlRouter
from swarm.peer.mailbox import Inbox
from swarm.peer.members import Members
from swarm.peer.reachability_notice import DialVerdict
from swarm.peer.reports import Reports
from swarm.peer.schedule_follower import ScheduleFollower

RUN = "r"


class Role:
    """Stands for the scheduler role this peer holds: what it was handed."""

    def __init__(self) -> None:
        self.delivered: list[GossipMessage] = []

    def deliver(self, msg: GossipMessage) -> None:
        self.delivered.append(msg)


def router(scheduler, me: str, *, schedule=None, role: Role | None = None):
    follower = ScheduleFollower(records=None, coordinator=scheduler.peer_id, heartbeat=60.0)  # the DHT is not read
    follower.schedule = schedule
    members = Members(me, RUN, token=None, issuers=lambda: {scheduler.peer_id})
    verdict, inbox = DialVerdict(me), Inbox()
    reports = Reports(me, RUN, gossip=lambda: None, own_role=lambda: None)
    r = ControlRouter(me, RUN, scheduler.peer_id, follower=follower, members=members, dial_verdict=verdict,
                      reports=reports, inbox=inbox, role=lambda: role)
    return r, members, verdict, inbox


def test_admissions_count_only_from_the_scheduler(scheduler):
    r, members, _, _ = router(scheduler, "me")
    cert = lambda p: MembershipCert.issue(scheduler, p, RUN, get_dht_time() + 60).to_msgpack()  # noqa: E731
    r.route(as_gossip(Admitted(peer="a", cert=cert("a")), RUN, "stranger"))
    assert not members.admits("a")
    r.route(as_gossip(Admitted(peer="a", cert=cert("a")), RUN, scheduler.peer_id))
    assert members.admits("a")


def test_a_sit_out_and_a_dial_back_verdict_are_taken_from_their_senders_only(scheduler, caplog):
    r, _, verdict, _ = router(scheduler, "me")
    with caplog.at_level(logging.WARNING):
        r.route(as_gossip(NotDialable(peer="me", tried=("/ip4/10.0.0.2/tcp/1",), relay=False), RUN, "stranger"))
        r.route(as_gossip(SitOut(peer="me", partner="b", stage=1, seconds=30.0), RUN, "stranger"))
        assert verdict.reachability == "" and not caplog.records
        r.route(as_gossip(NotDialable(peer="me", tried=("/ip4/10.0.0.2/tcp/1",), relay=False), RUN,
                          scheduler.peer_id))
        r.route(as_gossip(SitOut(peer="me", partner="b", stage=1, seconds=30.0), RUN, scheduler.peer_id))
    assert verdict.reachability == "unreachable"
    assert [getattr(x, EVENT_ATTR)["event"] for x in caplog.records] == ["not_dialable", "estranged"]


def test_a_bench_or_a_sit_out_from_the_scheduler_lengthens_the_wait_to_be_placed_again(scheduler, caplog):
    r, _, _, _ = router(scheduler, "me")
    with caplog.at_level(logging.WARNING):
        r.route(as_gossip(Benched(peer="me", iteration=7, seconds=300.0), RUN, "stranger"))
        r.route(as_gossip(Benched(peer="other", iteration=7, seconds=300.0), RUN, scheduler.peer_id))
        assert r.follower.sitting_out_until == 0.0
        r.route(as_gossip(SitOut(peer="me", partner="b", stage=1, seconds=30.0), RUN, scheduler.peer_id))
        assert 25.0 < r.follower.sitting_out_until - time.monotonic() <= 30.0
        r.route(as_gossip(Benched(peer="me", iteration=7, seconds=300.0), RUN, scheduler.peer_id))
        assert 295.0 < r.follower.sitting_out_until - time.monotonic() <= 300.0
    benched = [getattr(x, EVENT_ATTR) for x in caplog.records if getattr(x, EVENT_ATTR, {}).get("event") == "benched"]
    assert benched == [{"event": "benched", "iteration": 7, "seconds": 300.0}]


def test_a_broken_attempt_reaches_the_main_loop_only_from_a_scheduled_peer(scheduler, schedule):
    r, _, _, inbox = router(scheduler, "me", schedule=schedule)
    member = sorted(schedule.placement)[0]
    report = Broken(peer=member, iteration=0, epoch=schedule.epoch, microbatch=2, attempt=0, gone="x", why="reset")
    r.route(as_gossip(report, RUN, "stranger"))
    assert inbox.receive("hop", 0.05) == []
    r.route(as_gossip(report, RUN, member))
    (requeue,) = inbox.receive("hop", 1.0)
    assert isinstance(requeue, Requeue) and (requeue.microbatch, requeue.gone, requeue.reporter) == (2, "x", member)


def test_a_malformed_message_is_dropped_with_an_event_and_the_role_sees_everything(scheduler, caplog):
    role = Role()
    r, _, _, inbox = router(scheduler, "me", role=role)
    bad = GossipMessage(topic=f"skippipe/{RUN}/membership", sender="stranger", seqno=1, payload={"type": 3})
    other_run = as_gossip(SitOut(peer="me", partner="b", stage=1, seconds=1.0), "another-run", scheduler.peer_id)
    with caplog.at_level(logging.WARNING):
        r.route(bad)
        r.route(other_run)
    events = [getattr(x, EVENT_ATTR) for x in caplog.records if hasattr(x, EVENT_ATTR)]
    assert [(e["event"], e["sender"], e["kind"]) for e in events] == [
        ("ignored_control", "stranger", "malformed"), ("ignored_control", scheduler.peer_id, "malformed")]
    assert role.delivered == [bad, other_run]
    assert inbox.receive("hop", 0.05) == []

