"""DialBack: the coordinator dials each member's announced direct addresses (real TCP) and tells one that takes no
connection, a bounded number of times; strangers and relayed peers are never dialled. The peer tells its volunteer
once per verdict."""

from __future__ import annotations

import logging
import socket
import threading

import pytest

from swarm.control.messages import NotDialable
from swarm.coordinator.dial_back import TELL_TIMES, DialBack, addresses_to_try
from swarm.events import EVENT_ATTR
from swarm.peer.reachability_notice import DialVerdict
from swarm.wire import PeerRecord
from tests.utils.waiting import wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when this returns: a connection is refused


def record(peer: str, port: int, reachability: str = "") -> PeerRecord:
    return PeerRecord(peer_id=peer, stage=0, seconds_per_layer=0.1, memory_slots=1, reachability=reachability,
                      addresses=(f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}",
                                 f"/ip4/10.0.0.1/tcp/1/p2p/QmRelay/p2p-circuit/p2p/{peer}"))


def test_only_direct_addresses_of_peers_that_can_be_dialled_are_tried():
    assert addresses_to_try(record("QmA", 5)) == ("/ip4/127.0.0.1/tcp/5/p2p/QmA",)
    assert addresses_to_try(record("QmA", 5, "relayed")) == ()
    many = PeerRecord(peer_id="QmA", stage=0, seconds_per_layer=0.1, memory_slots=1,
                      addresses=tuple(f"/ip4/127.0.0.1/tcp/{p}" for p in range(1, 20)))
    assert len(addresses_to_try(many)) == 4


def test_members_that_take_no_connection_are_told_a_bounded_number_of_times(listener):
    told: list[NotDialable] = []
    members = {"QmOpen", "QmClosed", "QmRelayed", "QmMe"}
    back = DialBack(lambda: {}, members.__contains__, told.append, relay=True, exempt={"QmMe"})
    try:
        records = {"QmOpen": record("QmOpen", listener), "QmClosed": record("QmClosed", closed_port()),
                   "QmRelayed": record("QmRelayed", closed_port(), "relayed"), "QmMe": record("QmMe", closed_port()),
                   "QmStranger": record("QmStranger", closed_port())}
        back.check(records)
        wait_for(lambda: {"QmOpen", "QmClosed"} <= set(back.verdicts), 20, "both members dialled back")
        assert back.verdicts["QmOpen"][1] and not back.verdicts["QmClosed"][1]
        assert set(back.verdicts) == {"QmOpen", "QmClosed"}  # never a stranger, a relayed peer or itself
        for _ in range(TELL_TIMES + 3):
            back.check(records)
        assert [m.peer for m in told] == ["QmClosed"] * TELL_TIMES
        assert told[0].relay and told[0].tried == addresses_to_try(records["QmClosed"])
        records["QmClosed"] = record("QmClosed", listener)  # it forwarded a port: dialled again, found dialable
        back.check(records)
        wait_for(lambda: back.verdicts["QmClosed"][1], 20, "the new address dialled back")
    finally:
        back.stop()


def test_the_peer_tells_its_volunteer_once_per_verdict_and_its_record_says_it(caplog):
    verdict = DialVerdict("QmMe")
    tried = ("/ip4/192.168.1.11/tcp/4001",)
    assert verdict.reachability == ""  # not known before the dial-back
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            verdict.on_not_dialable(NotDialable(peer="QmMe", tried=tried, relay=False))
        verdict.on_not_dialable(NotDialable(peer="QmOther", tried=tried, relay=False))
    events = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert [e["event"] for e in events] == ["not_dialable"]
    assert events[0]["tried"] == list(tried) and "--announce-addr" in events[0]["advice"]
    assert verdict.reachability == "unreachable"  # what its signed record says from now on


def test_a_peer_that_left_its_reachability_to_auto_leaves_to_restart_relayed_when_the_coordinator_relays(caplog):
    verdict, stop = DialVerdict("QmMe"), threading.Event()
    verdict.leave_to_relay(stop)
    with caplog.at_level(logging.WARNING):
        verdict.on_not_dialable(NotDialable(peer="QmMe", tried=("/ip4/10.0.0.2/tcp/4001",), relay=False))
        assert not stop.is_set() and verdict.restart_as is None  # nobody relays: it can only be told what to do
        assert "--reachability relayed" not in caplog.records[-1].getMessage()
        for _ in range(3):  # told again (gossip may lose one): acted on once
            verdict.on_not_dialable(NotDialable(peer="QmMe", tried=("/ip4/192.168.1.11/tcp/4001",), relay=True))
    assert stop.is_set() and verdict.restart_as == "relayed"
    events = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert [e["event"] for e in events] == ["not_dialable", "not_dialable", "restarting"]
    manual = DialVerdict("QmMe")  # --reachability public or relayed was the volunteer's choice: only told
    with caplog.at_level(logging.WARNING):
        manual.on_not_dialable(NotDialable(peer="QmMe", tried=("/ip4/192.168.1.11/tcp/4001",), relay=True))
    assert manual.restart_as is None and "restart it with --reachability relayed" in caplog.records[-1].getMessage()
    asked = DialVerdict("QmMe")  # its volunteer asked it to stop first: it just stops
    asked.leave_to_relay(stopped := threading.Event())
    stopped.set()
    asked.on_not_dialable(NotDialable(peer="QmMe", tried=("/ip4/192.168.1.11/tcp/4001",), relay=True))
    assert asked.restart_as is None
