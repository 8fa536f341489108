"""Activations and gradients between peers over hivemind p2pd binary streams.

A message is ``[u32 header length][msgpack HopHeader][raw tensor bytes]``, answered by ``[u8 status][u16 length]
[utf-8 reason]`` (status 0 = accepted). Unary p2pd calls refuse messages over 4 MiB and protobuf streaming copies
every chunk, so tensors go over raw streams, in 1 MiB writes.

Each kind of traffic has a protocol of its own (`swarm.net.channels.CHANNELS`): pipeline hops (forwards and
backwards), a stage group's gradient exchange, and stage state transfers; each with its own streams, bounded queue
and consumer, and each refuses the other kinds' messages. Streams are reused: opening one costs ~1.8 ms (a request
to p2pd, a new yamux stream, a unix socket on each side), more than a whole 1 KiB message takes on an open one. So a
sender keeps a few idle streams per receiver and protocol and sends its next message on one of them. A stream
carries one message at a time (it is checked out for the whole exchange, so messages never interleave) and
concurrent sends to one peer use several streams. A stream that failed, timed out or carried a refused message is
closed, never reused; when a reused stream turns out to be dead before any reply (the receiver restarted, or closed
it as idle), the message goes once more on a new stream. Probes use the same streams, so a measured link costs what
a message pays.

The receiving side is a `swarm.net.receiver.Receiver`: it checks each message before allocating its tensor's
buffer, against the limits of `swarm.net.receive_limits` and the owner's hooks (`admitted`, `expects`,
`state_gate`), and acknowledges it only once the tensor sits in a bounded queue (backpressure).

A new stream goes directly to its peer or through the relay the peer's record names, and a forwarded stream is
served only when this peer's own relay carries it: `swarm.net.stream_routes.StreamRoutes`, which the transport owns.

A :class:`Transport` shares its peer's p2pd with the DHT, through a client of its own (`own_p2p`), so the peer id
that signs the DHT records is the one that sends and receives tensors. It runs its own event loop in a background
thread; the public methods are synchronous with explicit timeouts, with private async twins.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import torch
from hivemind import DHT
from hivemind.p2p import P2P

from swarm.constants import (
    CONNECT_TIMEOUT,
    INBOUND_QUEUE_SIZE,
    MAX_ERROR_CHARS,
    MAX_HEADER_BYTES,
    MAX_INBOUND_STREAMS_PER_SENDER,
    MAX_PENDING_BYTES_PER_SENDER,
    MAX_PROBE_BYTES,
    MAX_TENSOR_BYTES,
    MIN_TRANSFER_RATE,
    PROBE_TIMEOUT,
    RECV_TIMEOUT,
    SEND_TIMEOUT,
    STATE_ADMISSION_WAIT,
    STREAM_CHUNK_BYTES,
)
from swarm.net.channels import (  # noqa: F401  (re-exported: the transport's protocols and channels)
    AVERAGE_PROTOCOL,
    CHANNELS,
    HOP_PROTOCOL,
    PROBE_PROTOCOL,
    PROTOCOLS,
    STATE_PROTOCOL,
    Channel,
    OnReceive,
    channel_of,
    consumers,
)
from swarm.net.forwarding import forwarded_protocol
from swarm.net.idle_streams import IdleStreams
from swarm.net.p2p_client import own_p2p
from swarm.net.receive_limits import Admitted, Expects, SenderLimits, StateGate
from swarm.net.receiver import OK, Receiver
from swarm.net.stream_routes import StreamRoutes
from swarm.net.transport_errors import (  # noqa: F401  (re-exported: what the transport raises)
    MessageRefused,
    PeerUnreachable,
    TransportError,
)
from swarm.wire import HopHeader, WireError, check_restore, encode_tensor, torch_dtype

logger = logging.getLogger(__name__)

_ONE_WRITE_BYTES = 64 * 1024
"""Messages up to this size go out in a single write (one syscall, one p2pd frame)."""
HANDLER_REMOVAL_TIMEOUT = 2.0
"""Seconds the daemon gets to drop a stream handler at shutdown; the client is closed either way."""


async def read_reply(reader: asyncio.StreamReader, peer_id: str) -> tuple[int, str]:
    """The receiver's (status, reason) for the message just sent; TransportError if it closed the stream first."""
    try:
        head = await reader.readexactly(3)
        reason = await reader.readexactly(min(int.from_bytes(head[1:], "big"), MAX_ERROR_CHARS * 4))
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        raise TransportError(f"{peer_id} closed the stream without a reply: {e}") from None
    return head[0], reason.decode("utf-8", "replace")


class Transport:
    """Sends and receives ``(HopHeader, tensor)`` messages through the p2pd of a running DHT.

    Every inbound message is checked before its tensor's buffer is allocated (`swarm.net.receive_limits`); the
    hooks below let the owner say who may send what. Left None, a hook checks nothing (tests, tools).

    :param dht: the peer's started DHT; its p2pd (and so its peer id) is shared
    :param on_receive: consumer of accepted messages, one per channel ("hop", "average", "state") or one for all;
      it may block (compute), senders of that channel then wait
    :param max_tensor_bytes: largest tensor accepted; larger ones are refused before allocating
    :param queue_size: accepted messages waiting for ``on_receive``, and tensors being read at once, per channel
    :param run_id: if set, refuse messages of other runs
    :param recv_timeout: a sender that stalls longer than this between two reads is dropped, and an inbound stream
      idle this long between two messages is closed
    :param min_rate: bytes per second a tensor must arrive at, on average, after a grace of ``recv_timeout``
    :param max_pending: bytes per sender and channel allocated and not yet consumed; past it the sender waits
    :param max_streams: inbound streams one sender may hold open; further ones are closed at once
    :param admitted: whether a peer may open streams at all (see `Admitted`); refused streams are closed at once
    :param expects: why a message whose header passed the wire checks is not expected from its sender, or None
      (see `Expects`); e.g. the schedule's sender for that hop and the run's shape
    :param state_gate: if set, STATE messages only from the peers named in it (`StateGate.expect`); one from
      another waits up to ``state_wait`` seconds to be named, holding no buffer, then is refused
    :param addresses: peer id -> the circuit addresses its record announces (a peer behind NAT names its relays
      there, `swarm.net.reachability`): a stream to such a peer that does not open directly within
      `stream_routes.DIRECT_DIAL_TIMEOUT` is carried by its relay (`swarm.net.forwarding`); and this peer accepts
      forwarded streams only from the relays its own record names (`StreamRoutes`)
    :param link_delay: link emulation only: peer id -> one-way seconds each message to it waits before it is
      written (and each probe's reply after it is read), so that a local swarm pays a WAN's latencies
    """

    def __init__(self, dht: DHT, on_receive: OnReceive | Mapping[Channel, OnReceive], *,
                 max_tensor_bytes: int = MAX_TENSOR_BYTES, queue_size: int = INBOUND_QUEUE_SIZE,
                 run_id: str | None = None, recv_timeout: float = RECV_TIMEOUT, start_timeout: float = CONNECT_TIMEOUT,
                 min_rate: float = MIN_TRANSFER_RATE, max_pending: int = MAX_PENDING_BYTES_PER_SENDER,
                 max_streams: int = MAX_INBOUND_STREAMS_PER_SENDER, admitted: Admitted | None = None,
                 expects: Expects | None = None, state_gate: StateGate | None = None,
                 state_wait: float = STATE_ADMISSION_WAIT, link_delay: Callable[[str], float] | None = None,
                 addresses: Callable[[str], Sequence[str]] | None = None):
        if queue_size < 1 or min_rate <= 0:
            raise ValueError(f"queue_size must be >= 1 and min_rate > 0, got {queue_size} and {min_rate}")
        self.on_receive = consumers(on_receive)
        self.max_tensor_bytes, self.queue_size = max_tensor_bytes, queue_size
        self.run_id, self.recv_timeout, self.link_delay = run_id, recv_timeout, link_delay
        self.state_gate = state_gate
        self._addresses = addresses
        self._receiver_args = dict(run_id=run_id, max_tensor_bytes=max_tensor_bytes, queue_size=queue_size,
                                   recv_timeout=recv_timeout, min_rate=min_rate, admitted=admitted, expects=expects,
                                   state_gate=state_gate, state_wait=state_wait)
        self._limits_args = dict(max_streams=max_streams, max_pending=max_pending)
        self._stats = {"sent": 0, "bytes_sent": 0, "streams_opened": 0}
        self._in_flight: dict[str, set[concurrent.futures.Future]] = {}  # peer -> its sends and probes under way
        self._in_flight_lock = threading.Lock()
        self._idle = IdleStreams()  # touched only in the loop's thread
        self._receiver: Receiver | None = None
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
        self._p2p: P2P = await own_p2p(dht)
        self.peer_id: str = self._p2p.peer_id.to_base58()
        self._routes = routes = StreamRoutes(self._p2p, self._addresses, self._stats)
        self._receiver = r = Receiver(self.peer_id, self.on_receive, self._stats, self._consumer_pools,
                                      limits=SenderLimits(**self._limits_args), **self._receiver_args)
        for name, (protocol, _) in CHANNELS.items():
            await self._p2p.add_binary_stream_handler(protocol, functools.partial(r.serve, name))
            forwarded = functools.partial(routes.serve_forwarded, functools.partial(r.serve, name))
            await self._p2p.add_binary_stream_handler(forwarded_protocol(protocol), forwarded)
        await self._p2p.add_binary_stream_handler(PROBE_PROTOCOL, r.serve_probes)
        await self._p2p.add_binary_stream_handler(forwarded_protocol(PROBE_PROTOCOL),
                                                  functools.partial(routes.serve_forwarded, r.serve_probes))

    # ---- public API --------------------------------------------------------------------------------------------
    def send(self, peer_id: str, header: HopHeader, tensor: torch.Tensor, *, wire_dtype: str | None = None,
             timeout: float = SEND_TIMEOUT) -> None:
        """Deliver ``tensor`` to ``peer_id`` and return once the receiver has queued it.

        :param header: routing fields; its dtype and shape are filled in from ``tensor``
        :param wire_dtype: "float16"/"bfloat16" to cast a floating tensor for the wire; the receiver casts it back
        :raises PeerUnreachable: no stream to the peer could be opened (the message did not arrive)
        :raises TransportError: timed out (including waiting on a full receiver) or refused
        """
        self._run(self._send(peer_id, header, tensor, wire_dtype=wire_dtype), timeout, peer=peer_id)

    def probe(self, peer_id: str, nbytes: int, *, timeout: float = PROBE_TIMEOUT) -> float:
        """Round-trip seconds to send ``nbytes`` of filler to ``peer_id`` and get its acknowledgement."""
        return self._run(self._probe(peer_id, nbytes), timeout, peer=peer_id)

    def abandon(self, peer_id: str) -> int:
        """Give up on `peer_id` (it does not answer: a host frozen or cut off resets nothing, so its sends would wait
        out their timeouts): its sends and probes under way fail now with `TransportError` (delivered or not is
        unknown) and its idle streams are closed. Returns how many were cut short."""
        with self._in_flight_lock:
            pending = list(self._in_flight.get(peer_id, ()))
        for future in pending:
            future.cancel()
        self.drop_idle_streams(peer_id)
        return len(pending)

    def drop_idle_streams(self, peer_id: str) -> None:
        """Close the idle streams to `peer_id` (one that left, or whose side may have timed them out)."""

        async def drop() -> None:
            for protocol in PROTOCOLS:
                self._idle.close((peer_id, protocol))
        self._run(drop(), CONNECT_TIMEOUT)

    def stats(self) -> dict[str, int]:
        """Counters: messages sent and their bytes, streams opened (out), and the receiver's (`receiver.STATS`):
        messages received and their bytes, refused (of which unexpected, too slow), streams accepted and refused."""
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
        if self._receiver is not None:  # ends the handlers waiting for a next message: senders see EOF
            self._receiver.close()
        await asyncio.sleep(0)
        try:
            for name in (*PROTOCOLS, *map(forwarded_protocol, PROTOCOLS)):
                try:
                    await asyncio.wait_for(self._p2p.remove_binary_stream_handler(name), HANDLER_REMOVAL_TIMEOUT)
                except Exception as e:  # the daemon may already be gone with its DHT, or not answer
                    logger.debug("removing handler %s: %s", name, e)
        finally:  # whatever happened above: close the client, which also removes its unix socket file
            await self._p2p.shutdown()

    def _run(self, coro, timeout: float, *, peer: str | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop)
        if peer is not None:
            with self._in_flight_lock:
                self._in_flight.setdefault(peer, set()).add(future)
        try:
            return future.result()
        except TimeoutError:
            raise TransportError(f"timed out after {timeout:.1f}s") from None
        except concurrent.futures.CancelledError:
            raise TransportError(f"given up on {peer}: it does not answer") from None
        finally:
            if peer is not None:
                with self._in_flight_lock:
                    futures = self._in_flight.get(peer, set())
                    futures.discard(future)
                    if not futures:
                        self._in_flight.pop(peer, None)

    # ---- sending -----------------------------------------------------------------------------------------------
    async def _send(self, peer_id: str, header: HopHeader, tensor: torch.Tensor, *, wire_dtype: str | None) -> None:
        original = tensor.dtype
        desc, data = encode_tensor(tensor, wire_dtype=wire_dtype)
        restore = "" if torch_dtype(desc.dtype) == original else str(original).removeprefix("torch.")
        if restore:
            try:
                check_restore(desc.dtype, restore)  # the receiver refuses any other cast
            except WireError as e:
                raise ValueError(f"cannot send a {original} tensor compressed to {desc.dtype}: {e}") from None
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
        if status != OK:
            raise MessageRefused(f"{peer_id} refused the message: {reason}")
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
                stream = await self._routes.open(peer_id, protocol)
            keep = False
            try:
                try:
                    await write(stream.writer)
                except ConnectionError:
                    pass  # the receiver may have refused and closed before reading it all: its reply says why
                status, reason = await read_reply(stream.reader, peer_id)
                keep = status == OK
                return status, reason
            except TransportError:
                if not reused:
                    if attempt == 0 and await self._routes.relay_instead(peer_id):
                        continue  # a direct stream that died midway (a limited libp2p circuit): through the relay
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
        if status != OK:
            raise TransportError(f"{peer_id} refused the probe: {reason}")
        if self.link_delay is not None:  # the acknowledgement's way back
            await asyncio.sleep(self.link_delay(peer_id))
        return time.perf_counter() - start

