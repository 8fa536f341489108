"""Forwarding through a relay: a member's stream reaches a peer it cannot dial, as that member's; strangers and
peers that are not the destination's relay cannot use it or speak for anyone. Real DHTs and p2pd on loopback."""

from __future__ import annotations

import asyncio
import queue
import threading

import hivemind
import msgpack
import pytest
import torch
from hivemind.p2p import PeerID

from swarm.net.dht_shutdown import stop_dht
from swarm.net.forwarding import (
    Forwarder,
    ForwardError,
    decode_preamble,
    encode_preamble,
    forwarded_protocol,
    open_forwarded,
    relays_in,
)
from swarm.net.identity import ensure_identity
from swarm.net.transport import HOP_PROTOCOL, Transport
from swarm.wire import Direction, HopHeader

pytestmark = pytest.mark.timeout(120)

PEER = "QmYnyndLW2hfBBa5y8u9zjnuLVvtE6q4ZNd1rvCRz58hSr"
RELAY = "QmexWmtszR83DX4YEMcMY9VUWLi2h92iKYm2N8spursusP"


def test_relays_are_read_from_circuit_addresses():
    addrs = [f"/ip4/203.0.113.7/tcp/4001/p2p/{RELAY}/p2p-circuit/p2p/{PEER}", "/ip4/10.0.0.2/tcp/5/p2p/" + PEER,
             f"/dns4/relay.example/tcp/1/p2p/{RELAY}/p2p-circuit/p2p/{PEER}", "/p2p-circuit/p2p/" + PEER, "garbage"]
    assert relays_in(addrs) == [RELAY]


@pytest.mark.parametrize("fields, keys, problem", [
    ({"to": PEER}, ("to", "protocol"), "exactly the fields"),
    ({"to": PEER, "protocol": HOP_PROTOCOL, "x": "y"}, ("to", "protocol"), "exactly the fields"),
    ({"to": "not a peer id", "protocol": HOP_PROTOCOL}, ("to", "protocol"), "not a peer id"),
    ({"to": PEER, "protocol": "/ipfs/bitswap"}, ("to", "protocol"), "not a protocol of the transport"),
    ({"sender": 7}, ("sender",), "not a short string"),
    ({"sender": "Q" * 500}, ("sender",), "not a short string"),
])
def test_hostile_preambles_are_refused(fields, keys, problem):
    with pytest.raises(ForwardError, match=problem):
        decode_preamble(msgpack.packb(fields), keys)
    with pytest.raises(ForwardError, match="malformed"):
        decode_preamble(b"\xc1\xc1", keys)
    with pytest.raises(ForwardError):
        decode_preamble(b"\x93\x01\x02\x03", keys)  # an array, not a map


def _dht(tmp_path, name: str, initial_peers=()) -> hivemind.DHT:
    key = str(tmp_path / f"{name}.key")
    ensure_identity(key)
    return hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key, initial_peers=list(initial_peers),
                        start=True)


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """A relay (forwarding for members a and b), a destination b that names the relay in its circuit address, and a
    sender a with a bare DHT (it speaks the protocols by hand, as any peer may)."""
    tmp = tmp_path_factory.mktemp("forwarding")
    relay_dht = _dht(tmp, "relay")
    initial = [str(m) for m in relay_dht.get_visible_maddrs()]
    a_dht, b_dht = _dht(tmp, "a", initial), _dht(tmp, "b", initial)
    relay, a, b = (d.peer_id.to_base58() for d in (relay_dht, a_dht, b_dht))
    members = {a, b}
    forwarder = Forwarder(relay_dht, lambda peer: peer in members)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)
    a_p2p = run(a_dht.replicate_p2p())  # a's own client of its daemon, in this process
    inbox: queue.Queue = queue.Queue()
    circuit = f"{initial[0]}/p2p-circuit/p2p/{b}"
    receiver = Transport(b_dht, lambda *msg: inbox.put(msg), run_id="fw",
                         addresses=lambda peer: [circuit] if peer == b else [])
    try:
        yield dict(relay=relay, a=a, b=b, run=run, a_p2p=a_p2p, inbox=inbox, members=members, forwarder=forwarder)
    finally:
        run(a_p2p.shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        receiver.shutdown()
        forwarder.shutdown()
        for dht in (a_dht, b_dht, relay_dht):
            stop_dht(dht)


def _framed(trio, tensor: torch.Tensor) -> bytes:
    header = HopHeader(run="fw", iteration=1, microbatch=0, route=(trio["a"], trio["b"]), hop=1,
                       direction=Direction.FORWARD, epoch=0, dtype="float32", shape=tuple(tensor.shape)).to_msgpack()
    return len(header).to_bytes(4, "big") + header + tensor.numpy().tobytes()


def _through_relay(trio, payload: bytes, *, to: str | None = None) -> bytes:
    async def go():
        reader, writer = await open_forwarded(trio["a_p2p"], trio["relay"], to or trio["b"], HOP_PROTOCOL)
        try:
            writer.write(payload)
            await writer.drain()
            return await asyncio.wait_for(reader.readexactly(3), 20)
        finally:
            writer.close()
    return trio["run"](go())


def test_a_members_stream_reaches_the_destination_as_its_own(trio):
    tensor = torch.arange(300_000, dtype=torch.float32)  # 1.2 MB: far past libp2p's limited relay (128 KiB)
    assert _through_relay(trio, _framed(trio, tensor)) == b"\x00\x00\x00"
    sender, header, received = trio["inbox"].get(timeout=20)
    assert sender == trio["a"] and header.microbatch == 0 and torch.equal(received, tensor)
    assert trio["forwarder"].stats["forwarded"] >= 1


def test_the_relay_refuses_strangers_and_non_member_destinations(trio):
    trio["members"].discard(trio["a"])
    try:
        with pytest.raises(ForwardError, match="sender is not a member"):
            _through_relay(trio, b"")
    finally:
        trio["members"].add(trio["a"])
    with pytest.raises(ForwardError, match="destination is not a member"):
        _through_relay(trio, b"", to=trio["relay"])


def test_only_the_destinations_own_relay_may_speak_for_a_sender(trio):
    """`a` opens b's forwarded protocol itself, claiming to carry the relay's stream: b closes it unread."""
    async def go():
        _, reader, writer = await trio["a_p2p"].call_binary_stream_handler(PeerID.from_base58(trio["b"]),
                                                                        forwarded_protocol(HOP_PROTOCOL))
        try:
            writer.write(encode_preamble(sender=trio["relay"]) + _framed(trio, torch.ones(4)))
            await writer.drain()
            return await asyncio.wait_for(reader.read(16), 20)
        except ConnectionError:
            return b""  # closed on us, unread
        finally:
            writer.close()
    assert trio["run"](go()) == b""
    with pytest.raises(queue.Empty):
        trio["inbox"].get(timeout=1)


def test_a_relay_that_also_trains_gets_its_own_messages_at_once_and_keeps_them_after_relaying(tmp_path):
    """A public peer runs a forwarder and a transport on one DHT, each on its own event loop. Each must use a p2pd
    client of its own: sharing one (hivemind caches one per process), the transport's streams were served on the
    forwarder's loop, and a message it acknowledged reached its consumer only once something else woke its loop
    (50-60 s stalls); and stopping the forwarder stopped the transport's client too."""
    relay_dht = _dht(tmp_path, "relay")
    sender_dht = _dht(tmp_path, "sender", [str(m) for m in relay_dht.get_visible_maddrs()])
    relay, sender = relay_dht.peer_id.to_base58(), sender_dht.peer_id.to_base58()
    forwarder = Forwarder(relay_dht, lambda peer: True)  # first, as a public peer starts them
    inbox: queue.Queue = queue.Queue()
    receiver = Transport(relay_dht, lambda *msg: inbox.put(msg), run_id="fw")
    transport = Transport(sender_dht, lambda *msg: None, run_id="fw")
    try:
        def send_and_receive(microbatch: int) -> None:
            header = HopHeader(run="fw", iteration=1, microbatch=microbatch, route=(sender, relay), hop=1,
                               direction=Direction.FORWARD, epoch=0, dtype="", shape=())
            transport.send(relay, header, torch.full((64,), float(microbatch)), timeout=20)  # acknowledged...
            got_from, got, tensor = inbox.get(timeout=2)  # ...and so handed to the consumer, at once
            assert got_from == sender and got.microbatch == microbatch and float(tensor[0]) == microbatch
        for microbatch in range(5):
            send_and_receive(microbatch)
        forwarder.shutdown()
        send_and_receive(5)  # the relay stopped relaying; it still trains
    finally:
        transport.shutdown()
        receiver.shutdown()
        forwarder.shutdown()
        for dht in (sender_dht, relay_dht):
            stop_dht(dht)
