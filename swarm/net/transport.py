"""Activations and gradients between peers over hivemind p2pd binary streams.

A message is ``[u32 header length][msgpack HopHeader][raw tensor bytes]``, answered by ``[u8 status][u16 length]
[utf-8 reason]`` (status 0 = accepted). Unary p2pd calls refuse messages over 4 MiB and protobuf streaming copies
every chunk, so tensors go over raw streams, in 1 MiB writes.

Each kind of traffic has a protocol of its own (`CHANNELS`): pipeline hops (forwards and backwards), a stage group's
gradient exchange, and stage state transfers; each with its own streams, bounded queue and consumer, and each
refuses the other kinds' messages. Streams are reused: opening one costs ~1.8 ms (a request to p2pd, a new yamux
stream, a unix socket on each side), more than a whole 1 KiB message takes on an open one. So a sender keeps a few
idle streams per receiver and protocol and sends its next message on one of them. A stream carries one message at a
time (it is checked out for the whole exchange, so messages never interleave) and concurrent sends to one peer use
several streams. A stream that failed, timed out or carried a refused message is closed, never reused; when a reused
stream turns out to be dead before any reply (the receiver restarted, or closed it as idle), the message goes once
more on a new stream. Probes use the same streams, so a measured link costs what a message pays.

The receiver serves the messages of a stream one after another and checks each as if it came alone: the header
(schema, limits, that it is the addressed hop, the run) before allocating the tensor's buffer, and it acknowledges
only once the tensor sits in a bounded inbound queue: when the consumer falls behind, senders wait (backpressure).
Anything hostile (malformed msgpack, oversized or mis-sized tensors, bad dtypes, stalled senders) is refused with a
reason, logged with the sender's peer id, and ends that stream; the receiver keeps serving. Every stream has its
own task and a tensor buffer is allocated only under a bounded number of slots, so one hostile stream holds up
nobody else; a stream idle longer than ``recv_timeout`` between messages is closed.

A :class:`Transport` shares its peer's p2pd with the DHT (``DHT.replicate_p2p``), so the peer id that signs the
DHT records is the one that sends and receives tensors. It runs its own event loop in a background thread; the
public methods are synchronous with explicit timeouts, with private async twins.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import torch
from hivemind import DHT
from hivemind.p2p import P2P, PeerID

from swarm.constants import (
    CONNECT_TIMEOUT,
    INBOUND_QUEUE_SIZE,
    MAX_ERROR_CHARS,
    MAX_HEADER_BYTES,
    MAX_PROBE_BYTES,
    MAX_TENSOR_BYTES,
    PROBE_TIMEOUT,
    RECV_TIMEOUT,
    SEND_TIMEOUT,
    STREAM_CHUNK_BYTES,
)
from swarm.events import event
from swarm.net.idle_streams import IdleStream, IdleStreams
from swarm.wire import Direction, HopHeader, WireError, decode_tensor, encode_tensor, torch_dtype

logger = logging.getLogger(__name__)

Channel = Literal["hop", "average", "state"]

HOP_PROTOCOL = "skippipe.hop.v2"
"""Pipeline messages: forwards and backwards."""
AVERAGE_PROTOCOL = "skippipe.average.v1"
"""A stage group member's gradient sums for the group's all-gather."""
STATE_PROTOCOL = "skippipe.state.v1"
"""A stage's weights and optimizer state for a peer joining or moving to it."""
PROBE_PROTOCOL = "skippipe.probe.v1"
CHANNELS: dict[Channel, tuple[str, frozenset[Direction]]] = {
    "hop": (HOP_PROTOCOL, frozenset({Direction.FORWARD, Direction.BACKWARD})),
    "average": (AVERAGE_PROTOCOL, frozenset({Direction.AVERAGE})),
    "state": (STATE_PROTOCOL, frozenset({Direction.STATE})),
}
"""Each kind of traffic has a protocol of its own (and so streams, a bounded queue and a consumer of its own: a
flood of one kind never holds up another) and carries only its own directions."""
PROTOCOLS = (*(protocol for protocol, _ in CHANNELS.values()), PROBE_PROTOCOL)
_OK, _REFUSED = 0, 1
_ONE_WRITE_BYTES = 64 * 1024
"""Messages up to this size go out in a single write (one syscall, one p2pd frame)."""
REFUSAL_LINGER_BYTES = 4 << 20
REFUSAL_LINGER_S = 2.0
"""How much a refused sender may still write, and for how long, before the stream is closed under it."""
HANDLER_REMOVAL_TIMEOUT = 2.0
"""Seconds the daemon gets to drop a stream handler at shutdown; the client is closed either way."""

OnReceive = Callable[[str, HopHeader, torch.Tensor], None]
"""``on_receive(sender_peer_id, header, tensor)``, called in one worker thread per channel, one message at a time."""


def channel_of(direction: Direction) -> Channel:
    """The channel that carries messages of `direction`."""
    return next(name for name, (_, directions) in CHANNELS.items() if direction in directions)


def consumers(on_receive: OnReceive | Mapping[Channel, OnReceive]) -> dict[Channel, OnReceive]:
    """One consumer per channel: those given, or the one given for all."""
    handlers = on_receive if isinstance(on_receive, Mapping) else dict.fromkeys(CHANNELS, on_receive)
    if set(handlers) != set(CHANNELS):
        raise ValueError(f"on_receive needs a consumer for each of {sorted(CHANNELS)}, got {sorted(handlers)}")
    return dict(handlers)


class TransportError(RuntimeError):
    """A message that could not be delivered: unreachable peer, timeout, or refused by the receiver."""


class PeerUnreachable(TransportError):
    """No stream to the peer could be opened: the message certainly did not arrive (safe to send elsewhere)."""


async def read_reply(reader: asyncio.StreamReader, peer_id: str) -> tuple[int, str]:
    """The receiver's (status, reason) for the message just sent; TransportError if it closed the stream first."""
    try:
        head = await reader.readexactly(3)
        reason = await reader.readexactly(min(int.from_bytes(head[1:], "big"), MAX_ERROR_CHARS * 4))
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        raise TransportError(f"{peer_id} closed the stream without a reply: {e}") from None
    return head[0], reason.decode("utf-8", "replace")


async def reply(writer: asyncio.StreamWriter, status: int, reason: str) -> bool:
    """Answer the message just received (status 0 = accepted, with a reason otherwise); False if the stream is
    gone."""
    data = reason[:MAX_ERROR_CHARS].encode()
    try:
        writer.write(bytes([status]) + len(data).to_bytes(2, "big") + data)
        await writer.drain()
    except ConnectionError:
        return False
    return True


async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reason: str) -> None:
    """Refuse the message just read, with `reason`, and make sure the refusal reaches the sender.

    The stream is closed afterwards, and closing a socket with unread bytes in it resets the connection, which can
    destroy the reply before the sender reads it. So after replying, discard what the sender still writes, up to
    REFUSAL_LINGER_BYTES and for at most REFUSAL_LINGER_S: a hostile sender buys nothing by writing on.
    """
    if not await reply(writer, _REFUSED, reason):
        return
    remaining = REFUSAL_LINGER_BYTES
    try:
        async with asyncio.timeout(REFUSAL_LINGER_S):
            while remaining > 0 and (chunk := await reader.read(min(remaining, STREAM_CHUNK_BYTES))):
                remaining -= len(chunk)
    except (TimeoutError, ConnectionError):
        pass


class Transport:
    """Sends and receives ``(HopHeader, tensor)`` messages through the p2pd of a running DHT.

    :param dht: the peer's started DHT; its p2pd (and so its peer id) is shared
    :param on_receive: consumer of accepted messages, one per channel ("hop", "average", "state") or one for all;
      it may block (compute), senders of that channel then wait
    :param max_tensor_bytes: largest tensor accepted; larger ones are refused before allocating
    :param queue_size: accepted messages waiting for ``on_receive``; when full, inbound streams wait
    :param run_id: if set, refuse messages of other runs
    :param recv_timeout: a sender that stalls longer than this between two reads is dropped, and an inbound stream
      idle this long between two messages is closed
    :param link_delay: link emulation only: peer id -> one-way seconds each message to it waits before it is
      written (and each probe's reply after it is read), so that a local swarm pays a WAN's latencies
    """

    def __init__(self, dht: DHT, on_receive: OnReceive | Mapping[Channel, OnReceive], *,
                 max_tensor_bytes: int = MAX_TENSOR_BYTES, queue_size: int = INBOUND_QUEUE_SIZE,
                 run_id: str | None = None, recv_timeout: float = RECV_TIMEOUT, start_timeout: float = CONNECT_TIMEOUT,
                 link_delay: Callable[[str], float] | None = None):
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.on_receive = consumers(on_receive)
        self.max_tensor_bytes, self.queue_size = max_tensor_bytes, queue_size
        self.run_id, self.recv_timeout, self.link_delay = run_id, recv_timeout, link_delay
        self._stats = {"received": 0, "refused": 0, "sent": 0, "bytes_received": 0, "bytes_sent": 0,
                       "streams_opened": 0, "streams_accepted": 0}
        self._idle = IdleStreams()  # these two touched only in the loop's thread
        self._inbound: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="skippipe-transport", daemon=True)
        self._consumer_pools = {name: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"skippipe-{name}")
                                for name in CHANNELS}
        self._thread.start()
        try:
            self._run(self._start(dht), start_timeout)
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self, dht: DHT) -> None:
        self._queues = {name: asyncio.Queue(self.queue_size) for name in CHANNELS}
        self._slots = {name: asyncio.Semaphore(self.queue_size) for name in CHANNELS}  # tensors being read at once
        self._p2p: P2P = await dht.replicate_p2p()
        self.peer_id: str = self._p2p.peer_id.to_base58()
        for name, (protocol, _) in CHANNELS.items():
            await self._p2p.add_binary_stream_handler(protocol, functools.partial(self._handle_hop, name))
        await self._p2p.add_binary_stream_handler(PROBE_PROTOCOL, self._handle_probe)
        self._consumers = [asyncio.create_task(self._consume(name)) for name in CHANNELS]

    # ---- public API --------------------------------------------------------------------------------------------
    def send(self, peer_id: str, header: HopHeader, tensor: torch.Tensor, *, wire_dtype: str | None = None,
             timeout: float = SEND_TIMEOUT) -> None:
        """Deliver ``tensor`` to ``peer_id`` and return once the receiver has queued it.

        :param header: routing fields; its dtype and shape are filled in from ``tensor``
        :param wire_dtype: "float16"/"bfloat16" to cast a floating tensor for the wire; the receiver casts it back
        :raises PeerUnreachable: no stream to the peer could be opened (the message did not arrive)
        :raises TransportError: timed out (including waiting on a full receiver) or refused
        """
        self._run(self._send(peer_id, header, tensor, wire_dtype=wire_dtype), timeout)

    def probe(self, peer_id: str, nbytes: int, *, timeout: float = PROBE_TIMEOUT) -> float:
        """Round-trip seconds to send ``nbytes`` of filler to ``peer_id`` and get its acknowledgement."""
        return self._run(self._probe(peer_id, nbytes), timeout)

    def drop_idle_streams(self, peer_id: str) -> None:
        """Close the idle streams to `peer_id` (one that left, or whose side may have timed them out)."""

        async def drop() -> None:
            for protocol in PROTOCOLS:
                self._idle.close((peer_id, protocol))
        self._run(drop(), CONNECT_TIMEOUT)

    def stats(self) -> dict[str, int]:
        """Counters: messages received / refused / sent and their bytes, streams opened (out) and accepted (in)."""
        return dict(self._stats)

    def shutdown(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """Stop serving and close the connection to p2pd (the DHT's daemon keeps running)."""
        if not self._thread.is_alive():
            return
        try:
            self._run(self._shutdown(), timeout)
        except TransportError as e:
            logger.warning("transport shutdown: %s", e)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        for pool in self._consumer_pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    async def _shutdown(self) -> None:
        self._idle.close_all()
        for writer in list(self._inbound):  # ends the handlers waiting for a next message: senders see EOF
            writer.close()
        await asyncio.sleep(0)
        try:
            for name in PROTOCOLS:
                try:
                    await asyncio.wait_for(self._p2p.remove_binary_stream_handler(name), HANDLER_REMOVAL_TIMEOUT)
                except Exception as e:  # the daemon may already be gone with its DHT, or not answer
                    logger.debug("removing handler %s: %s", name, e)
            for consumer in self._consumers:
                consumer.cancel()
        finally:  # whatever happened above: close the client, which also removes its unix socket file
            await self._p2p.shutdown()

    def _run(self, coro, timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop)
        try:
            return future.result()
        except TimeoutError:
            raise TransportError(f"timed out after {timeout:.1f}s") from None

    # ---- sending -----------------------------------------------------------------------------------------------
    async def _send(self, peer_id: str, header: HopHeader, tensor: torch.Tensor, *, wire_dtype: str | None) -> None:
        original = tensor.dtype
        desc, data = encode_tensor(tensor, wire_dtype=wire_dtype)
        restore = "" if torch_dtype(desc.dtype) == original else str(original).removeprefix("torch.")
        header_bytes = dataclasses.replace(header, dtype=desc.dtype, shape=desc.shape,
                                           restore_dtype=restore).to_msgpack()
        if len(header_bytes) > MAX_HEADER_BYTES:
            raise ValueError(f"header of {len(header_bytes)} bytes exceeds {MAX_HEADER_BYTES}")
        prefix = len(header_bytes).to_bytes(4, "big") + header_bytes

        async def write(writer: asyncio.StreamWriter) -> None:
            if len(data) <= _ONE_WRITE_BYTES:
                writer.write(prefix + data)
            else:
                writer.write(prefix)
                for start in range(0, len(data), STREAM_CHUNK_BYTES):
                    writer.write(data[start : start + STREAM_CHUNK_BYTES])
                    await writer.drain()
            await writer.drain()

        status, reason = await self._exchange(peer_id, CHANNELS[channel_of(header.direction)][0], write)
        if status != _OK:
            raise TransportError(f"{peer_id} refused the message: {reason}")
        self._stats["sent"] += 1
        self._stats["bytes_sent"] += len(data)

    async def _exchange(self, peer_id: str, protocol: str,
                        write: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> tuple[int, str]:
        """Write one message on an idle stream to ``peer_id`` (or a new one) and return the receiver's reply.

        Only a stream whose message was accepted goes back to the idle pool; any other outcome (refusal, error,
        timeout or cancellation midway) closes it, since its framing is no longer known.
        """
        key = (peer_id, protocol)
        if self.link_delay is not None:
            await asyncio.sleep(self.link_delay(peer_id))
        for attempt in range(2):
            stream = self._idle.checkout(key) if attempt == 0 else None
            reused = stream is not None
            if stream is None:
                stream = await self._open(peer_id, protocol)
            keep = False
            try:
                try:
                    await write(stream.writer)
                except ConnectionError:
                    pass  # the receiver may have refused and closed before reading it all: its reply says why
                status, reason = await read_reply(stream.reader, peer_id)
                keep = status == _OK
                return status, reason
            except TransportError:
                if not reused:
                    raise
                # closed before any reply: nothing was delivered on it; its idle siblings are likely dead too
                logger.debug("a reused stream to %s was closed; sending again on a new one", peer_id)
                self._idle.close(key)
            finally:
                if keep:
                    self._idle.checkin(key, stream)
                else:
                    stream.close()
        raise AssertionError("unreachable: the second attempt uses a new stream, which returns or raises")

    async def _open(self, peer_id: str, protocol: str) -> IdleStream:
        try:
            _, reader, writer = await self._p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), protocol)
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as e:  # p2pd reports unreachable peers with assorted error types
            raise PeerUnreachable(f"cannot open a stream to {peer_id}: {type(e).__name__}: {e}") from None
        self._stats["streams_opened"] += 1
        return IdleStream(reader, writer)


    # ---- receiving ---------------------------------------------------------------------------------------------
    async def _handle_hop(self, channel: Channel, info: Any, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        sender = info.peer_id.to_base58()
        self._stats["streams_accepted"] += 1
        self._inbound.add(writer)
        try:
            while (size := await self._next_message(reader, sender, "message")) is not None:
                if not await self._receive_hop(channel, sender, size, reader, writer):
                    break
        finally:
            self._inbound.discard(writer)
            writer.close()

    async def _next_message(self, reader: asyncio.StreamReader, sender: str, what: str) -> int | None:
        """Wait for the u32 that opens the next message; None when the stream ends or idles at a message boundary.

        Raises nothing: a sender that stalls inside the u32 is dropped (logged, counted) like any stalled sender.
        """
        try:
            async with asyncio.timeout(self.recv_timeout):
                first = await reader.read(4)
        except TimeoutError:
            logger.debug("closing a %s stream from %s: idle for %.0fs", what, sender, self.recv_timeout)
            return None
        except ConnectionError:
            return None
        if not first:
            return None  # the sender closed its stream between messages: normal
        try:
            async with asyncio.timeout(self.recv_timeout):
                rest = await reader.readexactly(4 - len(first)) if len(first) < 4 else b""
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            self._dropped(sender, what, e)
            return None
        return int.from_bytes(first + rest, "big")

    def _dropped(self, sender: str, what: str, e: BaseException) -> None:
        if what == "message":
            self._stats["refused"] += 1
        logger.warning("dropped a %s from %s: stream ended or stalled (%s)", what, sender, type(e).__name__)

    async def _receive_hop(self, channel: Channel, sender: str, size: int, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> bool:
        """Read, check and queue one message of `channel`; reply. True when the stream may carry another message."""
        try:
            header = await self._read_header(reader, size)
            if header.direction not in CHANNELS[channel][1]:
                raise WireError(f"a {header.direction.name} message on the {channel} protocol")
            async with self._slots[channel]:  # only now, with the size known and checked, allocate the buffer
                buffer = bytearray(header.descriptor.nbytes)
                await self._read_into(reader, buffer)
                tensor = decode_tensor(header.descriptor, buffer, max_bytes=self.max_tensor_bytes)
                if header.restore_dtype:
                    tensor = tensor.to(torch_dtype(header.restore_dtype))
                await self._queues[channel].put((sender, header, tensor))  # waits while the consumer is behind
            self._stats["received"] += 1
            self._stats["bytes_received"] += len(buffer)
            return await reply(writer, _OK, "")
        except WireError as e:
            self._stats["refused"] += 1
            logger.warning("refused a message from %s: %s", sender, e,
                           extra=event("refused_message", sender=sender, why=str(e)))
            await refuse(reader, writer, str(e))
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            self._dropped(sender, "message", e)
        return False

    async def _read_header(self, reader: asyncio.StreamReader, size: int) -> HopHeader:
        if size > MAX_HEADER_BYTES:
            raise WireError(f"header of {size} bytes exceeds the limit of {MAX_HEADER_BYTES}")
        async with asyncio.timeout(self.recv_timeout):
            raw = await reader.readexactly(size)
        header = HopHeader.from_msgpack(raw, max_tensor_bytes=self.max_tensor_bytes)
        if header.target != self.peer_id:
            raise WireError(f"hop {header.hop} is addressed to {header.target}, not to this peer")
        if self.run_id is not None and header.run != self.run_id:
            raise WireError(f"message of run {header.run!r}, this peer serves run {self.run_id!r}")
        return header

    async def _read_into(self, reader: asyncio.StreamReader, buffer: bytearray) -> None:
        """Fill ``buffer`` from the stream; a sender silent for ``recv_timeout`` between two reads is dropped."""
        view, pos, loop = memoryview(buffer), 0, asyncio.get_running_loop()
        async with asyncio.timeout(self.recv_timeout) as deadline:  # one timer, pushed back after every read
            while pos < len(buffer):
                chunk = await reader.read(min(len(buffer) - pos, STREAM_CHUNK_BYTES))
                if not chunk:
                    raise WireError(f"stream ended after {pos} of {len(buffer)} tensor bytes")
                view[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
                deadline.reschedule(loop.time() + self.recv_timeout)


    async def _consume(self, channel: Channel) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sender, header, tensor = await self._queues[channel].get()
            try:
                await loop.run_in_executor(self._consumer_pools[channel], self.on_receive[channel], sender, header,
                                           tensor)
            except Exception:
                logger.exception("on_receive failed for microbatch %d from %s", header.microbatch, sender)

    # ---- probing -----------------------------------------------------------------------------------------------
    async def _probe(self, peer_id: str, nbytes: int) -> float:
        if not 0 <= nbytes <= MAX_PROBE_BYTES:
            raise ValueError(f"probe size must be in 0..{MAX_PROBE_BYTES}, got {nbytes}")
        filler = memoryview(bytes(min(nbytes, STREAM_CHUNK_BYTES)))

        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(nbytes.to_bytes(4, "big"))
            for pos in range(0, nbytes, STREAM_CHUNK_BYTES):
                writer.write(filler[: min(STREAM_CHUNK_BYTES, nbytes - pos)])
                await writer.drain()
            await writer.drain()

        start = time.perf_counter()
        status, reason = await self._exchange(peer_id, PROBE_PROTOCOL, write)
        if status != _OK:
            raise TransportError(f"{peer_id} refused the probe: {reason}")
        if self.link_delay is not None:  # the acknowledgement's way back
            await asyncio.sleep(self.link_delay(peer_id))
        return time.perf_counter() - start

    async def _handle_probe(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sender = info.peer_id.to_base58()
        self._inbound.add(writer)
        try:
            while (nbytes := await self._next_message(reader, sender, "probe")) is not None:
                if not await self._receive_probe(sender, nbytes, reader, writer):
                    break
        finally:
            self._inbound.discard(writer)
            writer.close()

    async def _receive_probe(self, sender: str, nbytes: int, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> bool:
        """Read and discard one probe's filler; reply. True when the stream may carry another probe."""
        try:
            if nbytes > MAX_PROBE_BYTES:
                raise WireError(f"probe of {nbytes} bytes exceeds the limit of {MAX_PROBE_BYTES}")
            remaining, loop = nbytes, asyncio.get_running_loop()
            async with asyncio.timeout(self.recv_timeout) as deadline:
                while remaining:
                    chunk = await reader.read(min(remaining, STREAM_CHUNK_BYTES))
                    if not chunk:
                        raise WireError("probe stream ended early")
                    remaining -= len(chunk)
                    deadline.reschedule(loop.time() + self.recv_timeout)
            return await reply(writer, _OK, "")
        except WireError as e:
            logger.warning("refused a probe from %s: %s", sender, e,
                           extra=event("refused_message", sender=sender, why=f"probe: {e}"))
            await refuse(reader, writer, str(e))
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            self._dropped(sender, "probe", e)
        return False
