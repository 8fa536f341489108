"""Tensors between two real peers (separate processes, real p2pd): bit-exact, backpressure, hostile input."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import queue
import threading
import time

import pytest
import torch
from hivemind.p2p import PeerID

from swarm.net.transport import HOP_PROTOCOL, MessageRefused, Transport, TransportError
from swarm.wire import Direction, HopHeader, pack
from tests.utils.swarm_workers import TRANSPORT_RUN as RUN

pytestmark = pytest.mark.timeout(120)


def header(local, remote, microbatch=0, **kw) -> HopHeader:
    fields = dict(run=RUN, iteration=1, microbatch=microbatch, route=(local.peer_id, remote.id), hop=1,
                  direction=Direction.FORWARD, epoch=0, dtype="float32", shape=())
    fields.update(kw)
    return HopHeader(**fields)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("nbytes", [1024, 4 * 2**20 + 8, 32 * 2**20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_tensors_arrive_bit_exact(local, remote, nbytes, dtype):
    numel = nbytes // dtype.itemsize
    if dtype.is_floating_point:
        t = torch.randn(numel // 64, 64, dtype=torch.float32).to(dtype)
        t.view(-1)[:3] = torch.tensor([float("nan"), float("-inf"), -0.0]).to(dtype)  # odd bit patterns too
    else:
        t = torch.randint(-(2**62), 2**62, (numel // 64, 64), dtype=dtype)
    local.send(remote.id, header(local, remote, microbatch=nbytes), t, timeout=60)
    sender, h, got_dtype, got = remote.received()
    assert sender == local.peer_id and h.microbatch == nbytes and h.shape == tuple(t.shape)
    assert got_dtype == str(dtype) and got == digest(t)


@pytest.mark.parametrize("wire_dtype", ["float16", "bfloat16"])
def test_wire_compression_restores_dtype(local, remote, wire_dtype):
    t = torch.randn(256, 64)
    local.send(remote.id, header(local, remote), t, wire_dtype=wire_dtype)
    _, h, got_dtype, got = remote.received()
    assert h.dtype == wire_dtype and got_dtype == "torch.float32"
    assert got == digest(t.to(getattr(torch, wire_dtype)).float())


def test_backpressure_makes_senders_wait(local, remote):
    delay, n = 0.4, 5
    assert remote.call("delay", delay) == delay
    try:
        start = time.perf_counter()
        for i in range(n):  # the consumer holds 1, the queue 1; every later send waits for the consumer
            local.send(remote.id, header(local, remote, microbatch=i), torch.full((4,), float(i)))
        elapsed = time.perf_counter() - start
        assert [remote.received()[1].microbatch for _ in range(n)] == list(range(n))  # in order, none lost
    finally:
        remote.call("delay", 0.0)
    assert elapsed >= (n - 2) * delay * 0.9
    with pytest.raises(TransportError, match="timed out"):
        remote.call("delay", 3.0)
        try:
            for i in range(3):
                local.send(remote.id, header(local, remote, microbatch=100 + i), torch.zeros(4), timeout=1.0)
        finally:
            remote.call("delay", 0.0)
    remote.logs()
    while True:  # drain what was delivered before the timeout
        try:
            remote.received(timeout=5)
        except queue.Empty:
            break


def raw_exchange(local: Transport, peer_id: str, payload: bytes, close_early: bool = False) -> bytes:
    """Write arbitrary bytes on a hop stream, as a hostile peer would; return whatever the receiver answers."""

    async def go():
        _, reader, writer = await local._p2p.call_binary_stream_handler(PeerID.from_base58(peer_id),
                                                                         HOP_PROTOCOL)
        writer.write(payload)
        await writer.drain()
        if close_early:
            writer.write_eof() if writer.can_write_eof() else writer.close()
        try:
            return await asyncio.wait_for(reader.read(4096), 10)
        finally:
            writer.close()

    return asyncio.run_coroutine_threadsafe(go(), local._loop).result(30)


def test_hostile_input_refused_and_receiver_keeps_serving(local, remote):
    before = remote.call("stats")["refused"]
    good = header(local, remote, dtype="float32", shape=(4,))

    def framed(h: bytes, body: bytes = b"") -> bytes:
        return len(h).to_bytes(4, "big") + h + body

    cases = {
        "malformed msgpack": framed(b"\xc1\xc1\xc1"),
        "header not a map": framed(pack([1, 2, 3])),
        "header too large": (10**6).to_bytes(4, "big") + b"\x80" * 64,
        "oversized tensor": framed(header(local, remote, dtype="float32", shape=(2**20, 2**20)).to_msgpack()),
        "bad dtype": framed(pack(dict(_fields(good), dtype="object"))),
        "negative shape": framed(pack(dict(_fields(good), shape=[-4]))),
        "float where int": framed(pack(dict(_fields(good), iteration=1.0))),
        "wrong target": framed(header(local, remote, route=(remote.id, local.peer_id)).to_msgpack()),
        "other run": framed(header(local, remote, run="other").to_msgpack()),
        "averaging on the hop protocol": framed(dataclasses.replace(good, direction=Direction.AVERAGE).to_msgpack(),
                                                b"\0" * 16),
        "state on the hop protocol": framed(dataclasses.replace(good, direction=Direction.STATE).to_msgpack(),
                                            b"\0" * 16),
    }
    for name, payload in cases.items():
        reply = raw_exchange(local, remote.id, payload)
        assert reply[:1] == b"\x01", (name, reply)  # refused with a reason
    # a tensor shorter than its header says: the stream ends early
    raw_exchange(local, remote.id, framed(good.to_msgpack(), b"\0" * 10), close_early=True)

    t = torch.arange(4.0)
    local.send(remote.id, good, t)  # still serving
    assert remote.received()[3] == digest(t)
    assert remote.call("stats")["refused"] - before == len(cases) + 1
    logs = remote.logs()
    assert len([m for m in logs if local.peer_id in m]) == len(cases) + 1, logs  # each logged with the sender's id


def _fields(h: HopHeader) -> dict:
    import msgpack

    return msgpack.unpackb(h.to_msgpack())


def test_abandon_fails_the_sends_waiting_on_a_peer_that_does_not_answer(local, remote):
    """A silent peer (a frozen host) leaves sends waiting out their timeouts; `abandon` fails them at once."""
    assert remote.call("delay", 4.0) == 4.0
    errors: list[TransportError] = []

    def send(i: int) -> None:
        try:
            local.send(remote.id, header(local, remote, microbatch=300 + i), torch.zeros(4), timeout=60)
        except TransportError as e:
            errors.append(e)

    try:
        senders = [threading.Thread(target=send, args=(i,)) for i in range(3)]
        for t in senders:  # the consumer holds 1, the queue 1: the third waits for an answer
            t.start()
            time.sleep(0.3)
        start = time.monotonic()
        assert local.abandon(remote.id) >= 1
        for t in senders:
            t.join(timeout=10)
        assert time.monotonic() - start < 3.0  # not the consumer's 4 s, nor the send's 60 s timeout
        assert errors and all("given up" in str(e) for e in errors), errors
        assert local.abandon(remote.id) == 0  # nothing left under way
    finally:
        remote.call("delay", 0.0)
    while True:  # drain what was delivered
        try:
            remote.received(timeout=10)
        except queue.Empty:
            break
    local.send(remote.id, header(local, remote, microbatch=310), torch.zeros(4))  # the peer is reached again
    assert remote.received()[1].microbatch == 310


def test_unreachable_peer_is_a_transport_error(local):
    with pytest.raises(TransportError):
        local.send("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", header(local, type("R", (), {"id": "x"})),
                   torch.zeros(1), timeout=5)


def test_concurrent_senders_all_delivered(local, remote):
    errors = []

    def send(i):
        try:
            local.send(remote.id, header(local, remote, microbatch=i), torch.full((1024,), float(i)))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors
    assert sorted(remote.received()[1].microbatch for _ in range(6)) == list(range(6))


# ---- stream reuse ------------------------------------------------------------------------------------------------
def test_many_messages_share_one_stream(local, remote):
    opened, accepted = local.stats()["streams_opened"], remote.call("stats")["streams_accepted"]
    sent = [torch.full((256,), float(i)) for i in range(20)] + [torch.randn(1024, 1024)]
    for i, t in enumerate(sent):
        local.send(remote.id, header(local, remote, microbatch=i), t)
    got = [remote.received() for _ in sent]
    assert [g[1].microbatch for g in got] == list(range(len(sent)))
    assert [g[3] for g in got] == [digest(t) for t in sent]
    # one stream at most (none if an earlier test left an idle one), where one per message used to be opened
    assert local.stats()["streams_opened"] - opened <= 1
    assert remote.call("stats")["streams_accepted"] - accepted <= 1


def test_refused_message_closes_its_stream_and_the_next_one_reopens(local, remote):
    local.drop_idle_streams(remote.id)  # start from no idle stream
    opened = local.stats()["streams_opened"]
    local.send(remote.id, header(local, remote), torch.zeros(4))  # leaves one idle stream
    remote.received()
    assert local.stats()["streams_opened"] == opened + 1
    with pytest.raises(MessageRefused, match="refused.*run"):  # it answered: reachable, not taken for gone
        local.send(remote.id, header(local, remote, run="other"), torch.zeros(4))
    assert local.stats()["streams_opened"] == opened + 1  # the refused message went on the idle stream
    t = torch.randn(1000)
    local.send(remote.id, header(local, remote, microbatch=7), t)
    assert local.stats()["streams_opened"] == opened + 2  # the refused one was closed, not reused
    assert remote.received()[3] == digest(t)
    assert any(local.peer_id in m and "run" in m for m in remote.logs())  # the refusal, logged with our id


def test_hostile_long_lived_stream_is_checked_per_message_and_blocks_nobody(local, remote):
    good = header(local, remote, dtype="float32", shape=(4,))
    framed = len(good.to_msgpack()).to_bytes(4, "big") + good.to_msgpack() + bytes(16)
    bad = header(local, remote, route=(remote.id, local.peer_id)).to_msgpack()

    async def go():
        _, reader, writer = await local._p2p.call_binary_stream_handler(PeerID.from_base58(remote.id),
                                                                         HOP_PROTOCOL)
        _, _, idler = await local._p2p.call_binary_stream_handler(PeerID.from_base58(remote.id), HOP_PROTOCOL)
        idler.write(b"\0\0")  # stalls inside a length prefix, holding its stream open
        try:
            replies = []
            for payload in (framed, framed, len(bad).to_bytes(4, "big") + bad):
                writer.write(payload)
                await writer.drain()
                replies.append(await asyncio.wait_for(reader.readexactly(3), 10))
            if replies[-1][0]:
                await asyncio.wait_for(reader.readexactly(int.from_bytes(replies[-1][1:], "big")), 10)
            replies.append(await asyncio.wait_for(reader.read(1), 10))  # the receiver closed the stream
            return replies
        finally:
            writer.close()
            idler.close()

    future = asyncio.run_coroutine_threadsafe(go(), local._loop)
    start = time.perf_counter()
    local.send(remote.id, header(local, remote, microbatch=3), torch.ones(8), timeout=10)  # others go through
    assert time.perf_counter() - start < 5
    replies = future.result(30)
    assert replies[:2] == [b"\0\0\0", b"\0\0\0"] and replies[2][0] == 1 and replies[3] == b""
    assert sorted(remote.received()[1].microbatch for _ in range(3)) == [0, 0, 3]
    assert any(local.peer_id in m and "addressed to" in m for m in remote.logs())


def test_concurrent_senders_on_reused_streams(local, remote):
    errors, threads_n, per_thread = [], 4, 8
    tensors = {t * 100 + i: torch.randn(64 * (1 + i % 3), 1024) for t in range(threads_n) for i in range(per_thread)}
    local.drop_idle_streams(remote.id)  # start from no idle stream: every stream used here is counted
    opened = local.stats()["streams_opened"]

    def send(t):
        try:
            for i in range(per_thread):
                mb = t * 100 + i
                local.send(remote.id, header(local, remote, microbatch=mb), tensors[mb])
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    got = {}
    for _ in tensors:
        _, h, _, d = remote.received()
        assert h.microbatch not in got  # each delivered once
        got[h.microbatch] = d
    for th in threads:
        th.join(30)
    assert not errors
    assert got == {mb: digest(t) for mb, t in tensors.items()}
    assert local.stats()["streams_opened"] - opened <= threads_n  # never more streams than concurrent sends


@pytest.mark.timeout(180)
def test_sender_reopens_after_receiver_idles_out_and_after_it_restarts(local, tmp_path):
    """A receiver closes idle streams (here after 1 s) and may restart with the same identity: sends go on."""
    import multiprocessing as mp

    from tests.utils.processes import join_or_stop, spawn
    from tests.utils.swarm_workers import transport_peer

    key = str(tmp_path / "identity.key")
    maddrs = [str(m) for m in local.dht.get_visible_maddrs()]
    ctx = mp.get_context("spawn")

    def start():
        queues = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
        proc = spawn(transport_peer, key, maddrs, {"recv_timeout": 1.0, "run_id": RUN}, *queues)
        tag, (_, peer_id) = queues[1].get(timeout=60)
        return proc, peer_id, queues

    def stop(proc, queues):
        queues[0].put(("stop",))
        join_or_stop(proc, timeout=15)

    proc, peer_id, queues = start()
    target = type("R", (), {"id": peer_id})
    try:
        opened = local.stats()["streams_opened"]
        for i in range(3):
            local.send(peer_id, header(local, target, microbatch=i), torch.full((8,), float(i)), timeout=30)
        assert local.stats()["streams_opened"] == opened + 1
        time.sleep(2.0)  # the receiver closes the idle stream
        local.send(peer_id, header(local, target, microbatch=3), torch.zeros(8), timeout=30)
        assert local.stats()["streams_opened"] == opened + 2
        assert [queues[2].get(timeout=30)[1].microbatch for _ in range(4)] == [0, 1, 2, 3]
    finally:
        stop(proc, queues)
    proc, peer_id2, queues = start()
    try:
        assert peer_id2 == peer_id
        t = torch.randn(2048)
        local.send(peer_id, header(local, target, microbatch=9), t, timeout=30)  # the old stream died with it
        assert queues[2].get(timeout=30)[1:] == (header(local, target, microbatch=9, shape=(2048,)), "torch.float32",
                                                 digest(t))
    finally:
        stop(proc, queues)
