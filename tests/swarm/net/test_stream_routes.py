"""A stream's route: a peer whose signed record (in a real DHT) names a relay is raced between a direct dial and its
relay, and remembered as relayed when only the relay reaches it; forwarded streams are served only from this
peer's own relays. Real DHTs, p2pd and a relay's Forwarder on loopback."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import hivemind
import pytest
from hivemind.p2p import PeerID

from swarm.control.records import SwarmRecords
from swarm.net.channels import PROBE_PROTOCOL
from swarm.net.dht_shutdown import stop_dht
from swarm.net.forwarding import Forwarder, encode_preamble, forwarded_protocol
from swarm.net.identity import ensure_identity, load_identity
from swarm.net.reachability import circuit_addresses
from swarm.net.stream_routes import StreamRoutes
from swarm.net.transport_errors import PeerUnreachable
from swarm.peer.reachability_notice import announced_addresses
from swarm.wire import PeerRecord

pytestmark = pytest.mark.timeout(120)

RUN = "routes"
DIRECT, FORWARDED = b"D", b"F"
"""What a destination's handler answers first: which of its handlers (the direct or the forwarded twin) served."""


def _dht(tmp, name: str, initial=()) -> tuple[hivemind.DHT, str]:
    key = str(tmp / f"{name}.key")
    ensure_identity(key)
    return hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key, initial_peers=list(initial),
                        start=True), key


def _answering(tag: bytes):
    """A destination's handler: reads a 4-byte request, answers ``tag`` + the peer id it takes the stream to be
    from, then closes."""
    async def serve(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readexactly(4)
            writer.write(tag + info.peer_id.to_base58().encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # a stream that lost the race is closed unused
        finally:
            writer.close()
    return serve


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """A relay forwarding for members a, b and c. b and c are relayed: their signed records name the relay in a
    circuit address. b takes streams only through the relay (it has no direct handler), c takes both. a sends."""
    tmp = tmp_path_factory.mktemp("routes")
    relay_dht, _ = _dht(tmp, "relay")
    initial = [str(m) for m in relay_dht.get_visible_maddrs()]
    (a_dht, a_key), (b_dht, b_key), (c_dht, c_key) = (_dht(tmp, n, initial) for n in "abc")
    relay, a, b, c = (d.peer_id.to_base58() for d in (relay_dht, a_dht, b_dht, c_dht))
    members = {a, b, c}
    forwarder = Forwarder(relay_dht, lambda peer: peer in members)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    records = {name: SwarmRecords(dht, load_identity(key), RUN)
               for name, dht, key in (("a", a_dht, a_key), ("b", b_dht, b_key), ("c", c_dht, c_key))}
    for name, peer in (("b", b), ("c", c)):
        assert records[name].publish_peer(PeerRecord(
            peer_id=peer, stage=1, seconds_per_layer=0.1, memory_slots=2, reachability="relayed",
            addresses=tuple(circuit_addresses(initial[:1], peer))))
    hooks = {name: announced_addresses(lambda: None, r.fetch_peers) for name, r in records.items()}
    p2ps = {name: run(dht.replicate_p2p()) for name, dht in (("a", a_dht), ("b", b_dht), ("c", c_dht))}
    own = {name: StreamRoutes(p2ps[name], hooks[name]) for name in "bc"}

    async def serve() -> None:
        await p2ps["b"].add_binary_stream_handler(
            forwarded_protocol(PROBE_PROTOCOL), functools.partial(own["b"].serve_forwarded, _answering(FORWARDED)))
        await p2ps["c"].add_binary_stream_handler(PROBE_PROTOCOL, _answering(DIRECT))
        await p2ps["c"].add_binary_stream_handler(
            forwarded_protocol(PROBE_PROTOCOL), functools.partial(own["c"].serve_forwarded, _answering(FORWARDED)))
    run(serve())
    try:
        yield dict(relay=relay, a=a, b=b, c=c, run=run, members=members, forwarder=forwarder, hook=hooks["a"],
                   a_p2p=p2ps["a"], own=own)
    finally:
        for p2p in p2ps.values():
            run(p2p.shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        forwarder.shutdown()
        for dht in (a_dht, b_dht, c_dht, relay_dht):
            stop_dht(dht)


def _routes(net, **kw) -> StreamRoutes:
    """The sender a's routes, fresh (nothing remembered), reading records through the peer's own hook."""
    return StreamRoutes(net["a_p2p"], net["hook"], {}, **kw)


def _ask(net, routes: StreamRoutes, peer: str) -> bytes:
    """Open a stream to `peer` through `routes`, send a request, return the whole answer."""
    async def go() -> bytes:
        stream = await routes.open(peer, PROBE_PROTOCOL)
        try:
            stream.writer.write(b"ping")
            await stream.writer.drain()
            return await asyncio.wait_for(stream.reader.read(), 20)
        finally:
            stream.close()
    return net["run"](go())


def test_a_peers_relay_is_read_from_its_signed_record_in_the_dht(net):
    routes = _routes(net)
    assert net["run"](routes.relay_of(net["b"])) == net["relay"]
    assert net["run"](routes.relay_of(net["relay"])) is None  # no record: dialled directly
    assert net["run"](StreamRoutes(net["a_p2p"], None).relay_of(net["b"])) is None  # no hook: nobody has a relay


def test_lookups_are_remembered_for_relays_cache_seconds_and_a_failing_one_is_no_relay(net):
    reads: list[str] = []

    def counted(peer: str):
        reads.append(peer)
        return net["hook"](peer)

    cached = StreamRoutes(net["a_p2p"], counted, relays_cache=60.0)
    assert [net["run"](cached.relay_of(net["b"])) for _ in range(3)] == [net["relay"]] * 3
    assert reads == [net["b"]]
    uncached = StreamRoutes(net["a_p2p"], counted, relays_cache=0.0)
    for _ in range(2):
        assert net["run"](uncached.relay_of(net["b"])) == net["relay"]
    assert reads == [net["b"]] * 3

    def broken(peer: str):
        raise RuntimeError("the DHT did not answer")
    assert net["run"](StreamRoutes(net["a_p2p"], broken).relay_of(net["b"])) is None


def test_a_peer_that_cannot_be_dialled_is_reached_through_its_relay_and_remembered(net):
    stats: dict[str, int] = {}
    routes = StreamRoutes(net["a_p2p"], net["hook"], stats, via_relay_for=2.0)
    forwarded = net["forwarder"].stats["forwarded"]
    assert not routes.via_relay(net["b"])
    assert _ask(net, routes, net["b"]) == FORWARDED + net["a"].encode()  # served as a's, by b's forwarded twin
    assert routes.via_relay(net["b"]) and stats["streams_opened"] == 1
    assert _ask(net, routes, net["b"]) == FORWARDED + net["a"].encode()
    assert net["forwarder"].stats["forwarded"] - forwarded == 2
    time.sleep(2.2)
    assert not routes.via_relay(net["b"])  # forgotten: the next stream races a direct dial again


def test_a_peer_that_can_be_dialled_is_reached_directly_even_with_a_relay(net):
    routes = _routes(net)
    assert _ask(net, routes, net["c"]) == DIRECT + net["a"].encode()
    assert not routes.via_relay(net["c"])


def test_after_a_direct_stream_died_the_relay_goes_first(net):
    routes = _routes(net)
    assert net["run"](routes.relay_instead(net["c"])) is True
    assert routes.via_relay(net["c"])
    assert net["run"](routes.relay_instead(net["c"])) is False  # through the relay already
    assert _ask(net, routes, net["c"]) == FORWARDED + net["a"].encode()  # c could be dialled: the relay went first
    assert net["run"](routes.relay_instead(net["relay"])) is False  # it names no relay: nothing to go through


def test_a_relay_that_lost_the_peer_sends_it_back_to_the_race(net):
    routes = _routes(net)
    assert net["run"](routes.relay_instead(net["b"]))
    net["members"].discard(net["b"])  # the relay refuses to carry streams to b now; b takes none directly
    try:
        with pytest.raises(PeerUnreachable, match="directly nor through its relay") as caught:
            _ask(net, routes, net["b"])
    finally:
        net["members"].add(net["b"])
    assert "destination is not a member" in str(caught.value)
    assert not routes.via_relay(net["b"])
    assert _ask(net, routes, net["b"]) == FORWARDED + net["a"].encode()  # the race finds the relay again


def test_a_peer_without_a_relay_that_takes_no_stream_is_unreachable(net):
    with pytest.raises(PeerUnreachable, match="cannot open a stream to"):
        net["run"](_routes(net).open(net["relay"], PROBE_PROTOCOL))  # the relay serves no probes itself


def test_forwarded_streams_are_served_only_from_this_peers_own_relays(net):
    assert net["run"](net["own"]["b"].trusted_relays()) == frozenset({net["relay"]})
    assert net["run"](StreamRoutes(net["a_p2p"], None).trusted_relays()) == frozenset()

    async def claim() -> bytes:
        """a opens b's forwarded twin itself, claiming to carry the relay's stream."""
        _, reader, writer = await net["a_p2p"].call_binary_stream_handler(PeerID.from_base58(net["b"]),
                                                                         forwarded_protocol(PROBE_PROTOCOL))
        try:
            writer.write(encode_preamble(sender=net["relay"]) + b"ping")
            await writer.drain()
            return await asyncio.wait_for(reader.read(), 20)
        except ConnectionError:
            return b""  # closed on us, unread
        finally:
            writer.close()
    assert net["run"](claim()) == b""  # not served: b's handler would have answered


def test_a_failing_read_of_its_own_record_keeps_the_relays_read_last(net):
    """The DHT not answering while a forwarded stream comes in is no reason to stop serving the relay's streams,
    nor to serve any other's."""
    answers = [lambda peer: net["hook"](peer), lambda peer: (_ for _ in ()).throw(TimeoutError("no answer"))]

    def flaky(peer: str):
        return answers[0](peer)
    routes = StreamRoutes(net["own"]["b"].p2p, flaky, relays_cache=0.0)  # b's, reading b's record
    assert net["run"](routes.trusted_relays()) == frozenset({net["relay"]})
    answers.pop(0)
    assert net["run"](routes.trusted_relays()) == frozenset({net["relay"]})
    fresh = StreamRoutes(net["own"]["b"].p2p, flaky, relays_cache=0.0)
    assert net["run"](fresh.trusted_relays()) == frozenset()  # nothing read yet: no relay is trusted
