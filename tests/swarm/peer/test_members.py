"""Members: which peers a peer takes streams from: the issuers, peers with a valid certificate from them, and the
peers of the schedule it follows (signed by its scheduler); never a peer the scheduler evicted."""

from __future__ import annotations

import threading
import time

import pytest
from hivemind.utils import get_dht_time

from swarm.control.membership import MembershipCert
from swarm.control.messages import Admitted, Refused
from swarm.peer import members as members_module
from swarm.peer.members import Members, NotAdmitted

RUN = "r"


def members(scheduler) -> Members:
    return Members("me", RUN, token=None, issuers=lambda: {scheduler.peer_id})


def cert(scheduler, peer: str, *, lifetime: float = 60.0) -> bytes:
    return MembershipCert.issue(scheduler, peer, RUN, get_dht_time() + lifetime).to_msgpack()


def test_strangers_are_refused_and_certified_peers_taken(scheduler):
    m = members(scheduler)
    assert m.admits("me") and m.admits(scheduler.peer_id) and not m.admits("a")
    m.on_control(scheduler.peer_id, Admitted(peer="a", cert=cert(scheduler, "a")))
    assert m.admits("a") and not m.admits("b")
    m.on_control(scheduler.peer_id, Admitted(peer="b", cert=cert(scheduler, "b", lifetime=-1.0)))
    assert not m.admits("b")  # an expired certificate


def test_the_peers_of_the_followed_schedule_are_members_until_evicted(scheduler):
    """A joiner takes its new group's messages before it has read their certificates."""
    m = members(scheduler)
    m.follow({"me", "a", "b"})
    assert m.admits("a") and m.admits("b") and not m.admits("c")
    m.on_control(scheduler.peer_id, Refused(peer="a", why="its join token is not this run's"))
    assert m.admits("a")  # a joiner's refusal bans nobody: it may come back with the right token
    m.on_control(scheduler.peer_id, Refused(peer="b", why="evicted: faulty", evicted=True))
    assert not m.admits("b")  # evicted: refused even though the schedule still names it
    m.follow({"me", "c"})
    assert m.admits("c") and not m.admits("a")  # only the schedule followed now


def test_a_waiting_joiner_asks_again_until_the_scheduler_answers(scheduler, monkeypatch):
    """Gossip may lose a `Join`: the joiner repeats it while it waits, and a refusal ends the wait with its reason."""
    monkeypatch.setattr(members_module, "ASK_AGAIN", 0.1)
    m = members(scheduler)
    asked = []

    def ask():
        asked.append(time.monotonic())
        if len(asked) == 3:
            m.on_control(scheduler.peer_id, Refused(peer="me", why="its join token is not this run's"))

    with pytest.raises(NotAdmitted, match="its join token is not this run's"):
        m.wait(threading.Event(), 10.0, ask=ask)
    assert len(asked) == 3 and asked[2] - asked[0] >= 0.2
    joiner = Members("me", RUN, token="a-token-0123456789abcdef", issuers=lambda: ())
    join = joiner.join_message()  # what `ask` gossips: the proof, and when (a replay later is too old to answer)
    assert join.peer == "me" and join.admission == joiner.proof != b"" and abs(join.sent - get_dht_time()) < 5
