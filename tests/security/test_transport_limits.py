"""Attacks on a peer's tensor transport, made the way a stranger would: raw p2pd streams to a real `Transport`.

Each was shown to work against the transport before its receive limits: four slow streams whose headers claimed
large tensors held every receive slot (an honest 4 KiB message was still undelivered after 6x the receive timeout);
`restore_dtype` turned 64 MiB of uint8 into a 512 MiB float64 tensor; STATE messages from anyone were kept; a
sender could fill the receiver's queue with its own messages; and any peer id could send anything the wire checks
let through. Three DHTs here: the attacker's, an honest sender's, and the receiver's (a fresh one per test, so
each gets its own limits and hooks).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Iterator

import hivemind
import pytest
import torch
from hivemind.p2p import PeerID

from swarm.net.dht_shutdown import stop_dht
from swarm.net.identity import ensure_identity
from swarm.net.receive_limits import SenderLimits, StateGate, all_of, pace_deadline, pipeline_shape
from swarm.net.transport import HOP_PROTOCOL, Transport, TransportError
from swarm.wire import Direction, HopHeader

RUN = "run-hostile-transport"
RECV_TIMEOUT = 1.0
pytestmark = pytest.mark.timeout(60)


class Peer:
    """A DHT with a transport that sends, and whose own inbound messages land in `inbox`."""

    def __init__(self, key: str, initial_peers: list[str]) -> None:
        ensure_identity(key)
        self.dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key,
                                start=True)
        self.inbox: queue.Queue = queue.Queue()
        self.transport: Transport | None = None

    def serve(self, on_receive=None, **options) -> Transport:
        self.transport = Transport(self.dht, on_receive or (lambda *m: self.inbox.put(m)), run_id=RUN, **options)
        return self.transport

    @property
    def id(self) -> str:
        return self.transport.peer_id

    def stop(self) -> None:
        if self.transport is not None:
            self.transport.shutdown()
        stop_dht(self.dht)


@pytest.fixture(scope="module")
def senders(tmp_path_factory) -> Iterator[tuple[Peer, Peer]]:
    """(attacker, honest sender), each a DHT with a transport."""
    started: list[Peer] = []
    try:
        for name in ("mallory", "honest"):
            maddrs = [str(m) for m in started[0].dht.get_visible_maddrs()] if started else []
            started.append(Peer(str(tmp_path_factory.mktemp(name) / "identity.key"), maddrs))
            started[-1].serve()
        yield started[0], started[1]
    finally:
        for peer in started:
            peer.stop()


@pytest.fixture
def peers(senders, tmp_path) -> Iterator[tuple[Peer, Peer, Peer]]:
    """(receiver, attacker, honest sender): a fresh receiver per test, its transport started by `serve`."""
    maddrs = [str(m) for m in senders[0].dht.get_visible_maddrs()]
    receiver = Peer(str(tmp_path / "identity.key"), maddrs)
    try:
        yield receiver, *senders
    finally:
        receiver.stop()


@pytest.fixture
def serve(peers):
    """Start the receiver's transport with the given consumer, limits and hooks."""

    def start(on_receive=None, **options) -> Transport:
        options.setdefault("recv_timeout", RECV_TIMEOUT)
        return peers[0].serve(on_receive, **options)

    return start


def header(sender: Peer, receiver: Peer, **kw) -> HopHeader:
    fields = dict(run=RUN, iteration=1, microbatch=0, route=(sender.id, receiver.id), hop=1,
                  direction=Direction.FORWARD, epoch=0, dtype="float32", shape=())
    fields.update(kw)
    return HopHeader(**fields)


def framed(h: HopHeader) -> bytes:
    data = h.to_msgpack()
    return len(data).to_bytes(4, "big") + data


def on_attacker(attacker: Peer, coro, timeout: float = 30):
    return asyncio.run_coroutine_threadsafe(coro, attacker.transport._loop).result(timeout)


async def open_raw(attacker: Peer, receiver: Peer, protocol: str = HOP_PROTOCOL):
    _, reader, writer = await attacker.transport._p2p.call_binary_stream_handler(PeerID.from_base58(receiver.id),
                                                                                 protocol)
    return reader, writer


def wait_for(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_slow_streams_claiming_large_tensors_hold_up_nobody(peers, serve):
    """Four trickling streams claiming 64 MiB tensors: the honest 4 KiB message arrives within 2x the receive
    timeout, and each trickler is dropped for falling behind the minimum pace."""
    receiver, attacker, honest = peers
    serve()
    claim = framed(header(attacker, receiver, shape=(4096, 4096)))  # 64 MiB of float32
    stop = asyncio.Event()

    async def trickle():
        streams = [await open_raw(attacker, receiver) for _ in range(4)]
        for _, writer in streams:
            writer.write(claim)
        try:
            while not stop.is_set():  # a byte per stream every 0.3 s: never silent for a whole receive timeout
                for _, writer in streams:
                    with contextlib.suppress(ConnectionError):
                        writer.write(b"\0")
                await asyncio.sleep(0.3)
        finally:
            for _, writer in streams:
                writer.close()

    future = asyncio.run_coroutine_threadsafe(trickle(), attacker.transport._loop)
    try:
        time.sleep(0.5)  # the tricklers have their headers in
        start = time.monotonic()
        t = torch.arange(1024.0)  # 4 KiB
        honest.transport.send(receiver.id, header(honest, receiver, shape=(1024,)), t, timeout=2 * RECV_TIMEOUT)
        assert time.monotonic() - start < 2 * RECV_TIMEOUT
        sender, h, got = receiver.inbox.get(timeout=5)
        assert sender == honest.id and torch.equal(got, t)
        stats = receiver.transport.stats
        assert wait_for(lambda: stats()["refused_slow"] >= 4, 12), stats()  # one after another, each ~1 s
    finally:
        attacker.transport._loop.call_soon_threadsafe(stop.set)
        future.result(10)
    assert receiver.inbox.empty()


def test_restore_dtype_cannot_inflate_a_tensor(peers, serve):
    """uint8 'restored' to float64 would be 8x the checked size: refused before the body is read."""
    receiver, attacker, _ = peers
    serve()
    body = bytes(1 << 20)

    async def go():
        reader, writer = await open_raw(attacker, receiver)
        try:
            writer.write(framed(header(attacker, receiver, dtype="uint8", shape=(len(body),),
                                       restore_dtype="float64")) + body)
            await writer.drain()
            return await asyncio.wait_for(reader.read(4096), 10)
        finally:
            writer.close()

    answer = on_attacker(attacker, go())
    assert answer[:1] == b"\x01" and b"restore_dtype" in answer, answer
    assert receiver.transport.stats()["refused"] == 1 and receiver.inbox.empty()
    t = torch.randn(64, 64)  # compression that is undone is still fine
    attacker.transport.send(receiver.id, header(attacker, receiver), t, wire_dtype="bfloat16")
    _, h, got = receiver.inbox.get(timeout=5)
    assert h.restore_dtype == "float32" and got.dtype == torch.float32 and torch.equal(got, t.bfloat16().float())


def test_stage_state_only_from_a_named_source(peers, serve):
    """STATE from a peer the receiver did not name is refused after a short wait; a source named meanwhile (it
    adopted the schedule first) gets through, and so does one named before."""
    receiver, attacker, honest = peers
    gate = StateGate()
    serve(state_gate=gate, state_wait=0.5)
    state = lambda p, part: header(p, receiver, direction=Direction.STATE, microbatch=part, stages=(1, 1))  # noqa: E731
    with pytest.raises(TransportError, match="not named"):
        attacker.transport.send(receiver.id, state(attacker, 0), torch.zeros(256), timeout=10)
    assert receiver.transport.stats()["refused_unexpected"] == 1 and receiver.inbox.empty()

    sent = threading.Thread(target=honest.transport.send, args=(receiver.id, state(honest, 0), torch.ones(256)))
    sent.start()
    time.sleep(0.2)
    gate.expect([honest.id], timeout=10)  # named while its message waits, before any buffer
    sent.join(10)
    honest.transport.send(receiver.id, state(honest, 1), torch.ones(8))
    assert [receiver.inbox.get(timeout=5)[1].microbatch for _ in range(2)] == [0, 1]
    gate.forget()
    with pytest.raises(TransportError, match="not named"):
        honest.transport.send(receiver.id, state(honest, 0), torch.ones(256), timeout=10)


def test_unexpected_sender_and_shape_refused_before_allocating(peers, serve):
    """The owner's `expects` (schedule: who sends this hop; the run's shape) answers right after the header: the
    attacker is refused without sending a byte of its claimed 256 MiB."""
    receiver, attacker, honest = peers
    scheduled = lambda sender, h: None if sender == honest.id else "not the scheduled sender"  # noqa: E731
    serve(expects=all_of(pipeline_shape((2, 8, 16)), scheduled))

    async def claim_only():
        reader, writer = await open_raw(attacker, receiver)
        try:
            writer.write(framed(header(attacker, receiver, shape=(2, 8, 16 << 20))))  # no body follows
            await writer.drain()
            return await asyncio.wait_for(reader.read(4096), 10)
        finally:
            writer.close()

    answer = on_attacker(attacker, claim_only())
    assert answer[:1] == b"\x01" and b"shape" in answer, answer
    with pytest.raises(TransportError, match="not the scheduled sender"):
        attacker.transport.send(receiver.id, header(attacker, receiver), torch.zeros(2, 8, 16), timeout=10)
    t = torch.randn(2, 8, 16)
    honest.transport.send(receiver.id, header(honest, receiver), t)
    assert torch.equal(receiver.inbox.get(timeout=5)[2], t)
    assert receiver.transport.stats()["refused_unexpected"] == 2


def test_a_sender_not_admitted_or_over_its_streams_is_cut_off_at_once(peers, serve):
    receiver, attacker, honest = peers
    banned = {attacker.id}
    serve(admitted=lambda p: p not in banned, max_streams=2, recv_timeout=5.0)
    with pytest.raises(TransportError):
        attacker.transport.send(receiver.id, header(attacker, receiver), torch.zeros(4), timeout=10)
    assert receiver.transport.stats()["refused_streams"] >= 1
    honest.transport.send(receiver.id, header(honest, receiver), torch.zeros(4))
    assert receiver.inbox.get(timeout=5)[0] == honest.id

    banned.clear()
    refused = receiver.transport.stats()["refused_streams"]

    async def closed_at_once(reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(1), 2.5) == b""
        except TimeoutError:
            return False  # still open: the receiver waits for a message on it (it idles out after 5 s)

    async def three_streams():
        streams = [await open_raw(attacker, receiver) for _ in range(3)]
        try:
            return await asyncio.gather(*(closed_at_once(reader) for reader, _ in streams))
        finally:
            for _, writer in streams:
                writer.close()

    assert sorted(on_attacker(attacker, three_streams())) == [False, False, True]  # one over the limit of 2
    assert receiver.transport.stats()["refused_streams"] == refused + 1


def test_a_sender_cannot_fill_the_receivers_queue(peers, serve):
    """With the consumer stalled, one sender's messages wait once it has max_pending bytes unconsumed (none of
    them allocated); another sender's message still gets the queue's room."""
    receiver, attacker, honest = peers
    release = threading.Event()

    def stalled(*m) -> None:  # the consumer takes a message, then waits for `release`
        receiver.inbox.put(m)
        release.wait(20)

    serve(stalled, max_pending=3 * 16 * 1024, queue_size=4)
    try:
        for i in range(3):  # the consumer holds the first, the queue the next two: 48 KiB pending
            attacker.transport.send(receiver.id, header(attacker, receiver, microbatch=i), torch.zeros(4096),
                                    timeout=5)
        with pytest.raises(TransportError, match="timed out"):
            attacker.transport.send(receiver.id, header(attacker, receiver, microbatch=3), torch.zeros(4096),
                                    timeout=1.5)
        honest.transport.send(receiver.id, header(honest, receiver, microbatch=9), torch.zeros(4096), timeout=5)
    finally:
        release.set()
    got = sorted((m[0] == honest.id, m[1].microbatch) for m in
                 (receiver.inbox.get(timeout=5) for _ in range(4)))
    assert got == [(False, 0), (False, 1), (False, 2), (True, 9)]


# ---- the limits on their own (no network) ------------------------------------------------------------------------
def test_pace_deadline_is_a_stall_timeout_and_a_minimum_rate():
    kw = dict(recv_timeout=2.0, min_rate=1000.0)
    assert pace_deadline(0.0, 0, now=0.0, **kw) == 2.0  # nothing yet: the grace
    assert pace_deadline(0.0, 10_000, now=3.0, **kw) == 5.0  # well ahead of the pace: only a stall counts
    assert pace_deadline(0.0, 500, now=1.0, **kw) == 2.5  # behind: dropped at 2.5 s unless more comes
    assert pace_deadline(0.0, 1_000_000, now=900.0, **kw) <= 2.0 + 1_000_000 / 1000.0  # the total deadline


def test_sender_limits_bound_streams_and_pending_bytes():
    async def go():
        limits = SenderLimits(max_streams=2, max_pending=100)
        assert limits.open_stream("a") and limits.open_stream("a") and not limits.open_stream("a")
        assert limits.open_stream("b")  # per sender
        await limits.reserve("a", "hop", 60)
        await limits.reserve("a", "hop", 40)
        third = asyncio.create_task(limits.reserve("a", "hop", 1))
        await asyncio.sleep(0.05)
        assert not third.done() and limits.pending("a", "hop") == 100
        await limits.reserve("a", "state", 100)  # other channels and senders are not held up
        await limits.reserve("b", "hop", 500)  # alone, a message may exceed the cap
        await limits.release("a", "hop", 60)
        await asyncio.wait_for(third, 1)
        assert limits.pending("a", "hop") == 41

    asyncio.run(go())


def test_state_gate_names_sources_for_a_while():
    gate = StateGate()
    assert not gate.admits("p")
    gate.expect(["p"], timeout=0.2)
    assert gate.admits("p") and not gate.admits("q")
    time.sleep(0.3)
    assert not gate.admits("p")  # its window passed
    gate.expect(["p", "q"])
    gate.forget(["p"])
    assert not gate.admits("p") and gate.admits("q")

