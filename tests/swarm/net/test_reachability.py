"""Reachability: who is dialled directly and who through a relay, announced addresses checked like any input, the
dial-back a public peer runs on a joiner's addresses, and the record field that carries the verdict."""

from __future__ import annotations

import socket

import pytest

from swarm.codec import WireError
from swarm.net.reachability import (
    RELAY_MODE,
    RELAYED_MODE,
    announce_problem,
    circuit_addresses,
    decide,
    dht_options,
    dial_back,
    reachable_addresses,
)
from swarm.wire import PeerRecord


def test_auto_is_public_with_an_announced_address_and_otherwise_leaves_the_daemon_as_it_is():
    """Relaying is opt-in while experimental: a private address is no proof of being unreachable (a lab)."""
    assert decide("auto", "192.168.1.10") is None and decide("auto", "0.0.0.0") is None
    assert decide("auto", "8.8.8.8") is None and decide("auto", "127.0.0.1") is None
    assert decide("auto", "192.168.1.10", ["/ip4/203.0.113.7/tcp/31337"]) == "public"
    assert decide("relayed", "8.8.8.8") == "relayed" and decide("public", "10.0.0.2") == "public"
    assert dht_options(None) == {} and dht_options(None, announce=["/ip4/203.0.113.7/tcp/1"]) == {
        "announce_maddrs": ["/ip4/203.0.113.7/tcp/1"]}
    with pytest.raises(ValueError, match="reachability must be one of"):
        decide("sometimes", "10.0.0.2")


def test_daemon_options_relay_for_others_or_reserve_on_the_relays():
    relay = "/ip4/198.51.100.1/tcp/4000/p2p/QmRelay"
    assert dht_options("public", announce=["/ip4/203.0.113.7/tcp/31337"]) == {
        "announce_maddrs": ["/ip4/203.0.113.7/tcp/31337"], "force_reachability": RELAY_MODE}
    relayed = dht_options("relayed", relays=[relay])
    assert relayed["force_reachability"] == RELAYED_MODE and relayed["use_auto_relay"] is True
    assert relayed["trusted_relays"] == [relay]
    with pytest.raises(ValueError, match="needs at least one relay"):
        dht_options("relayed")
    assert circuit_addresses([relay, "/ip4/1.2.3.4/tcp/1"], "QmMe") == [f"{relay}/p2p-circuit/p2p/QmMe"]


def test_announced_addresses_are_checked_and_unspecified_or_foreign_loopback_ones_never_announced():
    assert announce_problem("/ip4/203.0.113.7/tcp/31337") is None
    assert announce_problem("/dns4/volunteer.example.org/tcp/31337") is None
    for bad, why in [("203.0.113.7:31337", "not a multiaddr"), ("/ip4/203.0.113.7/tcp/0", "the port"),
                     ("/ip4/0.0.0.0/tcp/31337", "unspecified"), ("/ip4/1.2.3.4/udp/5/quic", "not a multiaddr")]:
        assert why in announce_problem(bad), bad
    seen = ["/ip4/127.0.0.1/tcp/5", "/ip4/0.0.0.0/tcp/5", "/ip4/192.168.1.10/tcp/5", "/ip6/::1/tcp/5"]
    assert reachable_addresses(seen, "0.0.0.0") == ["/ip4/192.168.1.10/tcp/5"]
    assert reachable_addresses(seen, "127.0.0.1") == ["/ip4/127.0.0.1/tcp/5", "/ip4/192.168.1.10/tcp/5",
                                                      "/ip6/::1/tcp/5"]


def test_dial_back_finds_the_listening_address_only():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        with socket.socket() as spare:
            spare.bind(("127.0.0.1", 0))
            closed = spare.getsockname()[1]  # bound, not listening: refused
        here = f"/ip4/127.0.0.1/tcp/{port}"
        assert dial_back([here, f"/ip4/127.0.0.1/tcp/{closed}", f"{here}/p2p/Qm/p2p-circuit/p2p/Qx"],
                         timeout=1.0) == [here]


def test_the_record_carries_the_verdict_and_refuses_anything_else():
    record = PeerRecord(peer_id="Qm", stage=0, seconds_per_layer=0.1, memory_slots=2, reachability="relayed")
    assert PeerRecord.from_msgpack(record.to_msgpack()).reachability == "relayed"
    older = PeerRecord(peer_id="Qm", stage=0, seconds_per_layer=0.1, memory_slots=2)
    assert "reachability" not in older.to_msgpack().decode("latin-1")  # optional: older peers still decode it
    assert PeerRecord.from_msgpack(older.to_msgpack()).reachability == ""
    forged = record.to_msgpack().replace(b"relayed", b"maybe!!")
    with pytest.raises(WireError, match="peer.reachability"):
        PeerRecord.from_msgpack(forged)


def test_the_transport_dials_announced_addresses_of_relayed_peers_only():
    """A peer that is not relayed is left to p2pd's own routing: a dead one is unreachable at once, not redialled."""
    from swarm.peer.reachability_notice import announced_addresses
    from swarm.wire import PeerRecord

    circuit = "/ip4/10.0.0.254/tcp/4000/p2p/QmRelay/p2p-circuit/p2p/QmHome"
    records = {"home": PeerRecord(peer_id="home", stage=1, seconds_per_layer=0.1, memory_slots=2,
                                  addresses=("/ip4/192.168.1.10/tcp/5000", circuit), reachability="relayed"),
               "pub": PeerRecord(peer_id="pub", stage=1, seconds_per_layer=0.1, memory_slots=2,
                                 addresses=("/ip4/10.0.0.1/tcp/5000",), reachability="public")}
    fetched = []
    lookup = announced_addresses(lambda: records, lambda: fetched.append(1) or {})
    assert lookup("home") == (circuit,) and lookup("pub") == () and lookup("stranger") == () and not fetched
    before_any_read = announced_addresses(lambda: None, lambda: records)
    assert before_any_read("home") == (circuit,)
    # before the watch's first read, one DHT read serves the hook a while (a joiner dials its sample at once)
    now = [0.0]
    reads = []
    cached = announced_addresses(lambda: None, lambda: reads.append(now[0]) or records, clock=lambda: now[0])
    assert cached("home") == (circuit,) and cached("pub") == () and cached("home") == (circuit,)
    now[0] = 0.5
    assert cached("newcomer") == () and reads == [0.0]  # too soon to read again
    now[0] = 2.0
    assert cached("newcomer") == () and reads == [0.0, 2.0]  # missing from an older read: looked up again
    now[0] = 3.0
    assert cached("home") == (circuit,) and reads == [0.0, 2.0]
    now[0] = 8.0
    assert cached("home") == (circuit,) and reads == [0.0, 2.0, 8.0]  # past its lifetime
