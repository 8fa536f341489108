"""`Receiver`: the receiving side of a `Transport`, which serves every inbound stream and probe of a peer.

A message is ``[u32 header length][msgpack HopHeader][raw tensor bytes]``, answered by ``[u8 status][u16 length]
[utf-8 reason]`` (status 0 = accepted). The messages of a stream are served one after another, each checked as if
it came alone, everything before the tensor's buffer is allocated (`swarm.net.receive_limits`): the sender may
open streams; the header's schema and limits, that it is the addressed hop of this run on its channel, and that a
restore cast only undoes compression; the owner's `expects` (the sender the schedule expects, the run's shape);
stage state only from a named source; one read at a time and bounded pending bytes per sender and channel. The
bytes must then come at a minimum pace and within a total deadline. A message is acknowledged only once its tensor
sits in its channel's bounded queue: when the consumer falls behind, senders wait (backpressure).

Anything hostile (malformed msgpack, oversized or mis-sized tensors, bad dtypes, unexpected senders, stalled or
trickling senders) is refused with a reason, counted, logged with the sender's peer id (event ``refused_message``),
and ends that stream; the receiver keeps serving. A stream idle longer than ``recv_timeout`` between messages is
closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Mapping
from typing import Any

from swarm.constants import MAX_ERROR_CHARS, MAX_HEADER_BYTES, MAX_PROBE_BYTES, STREAM_CHUNK_BYTES
from swarm.events import event
from swarm.net.channels import CHANNELS, Channel, OnReceive
from swarm.net.receive_limits import Admitted, Expects, SenderLimits, StateGate, bytes_needed, pace_deadline
from swarm.wire import Direction, HopHeader, WireError, decode_tensor, torch_dtype

logger = logging.getLogger(__name__)

OK, REFUSED = 0, 1
REFUSAL_LINGER_BYTES = 4 << 20
REFUSAL_LINGER_S = 2.0
"""How much a refused sender may still write, and for how long, before the stream is closed under it."""
STATS = ("received", "refused", "refused_streams", "refused_unexpected", "refused_slow", "bytes_received",
         "streams_accepted")
"""The receiver's counters (`Transport.stats`): messages accepted; refused or dropped (every cause); of those, the
ones its owner did not expect and the ones that came too slowly; streams closed at once (sender not admitted or
over its stream limit); tensor bytes accepted; streams served."""


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
    if not await reply(writer, REFUSED, reason):
        return
    remaining = REFUSAL_LINGER_BYTES
    try:
        async with asyncio.timeout(REFUSAL_LINGER_S):
            while remaining > 0 and (chunk := await reader.read(min(remaining, STREAM_CHUNK_BYTES))):
                remaining -= len(chunk)
    except (TimeoutError, ConnectionError):
        pass


class _Unexpected(WireError):
    """A well-formed message its receiver does not expect from this sender (refused like malformed input)."""


class Receiver:
    """Serves inbound streams (`serve`, `serve_probes`) and hands accepted messages to each channel's consumer.

    Built and used in the transport's event loop; `stats` is the transport's counter dict, shared.
    See `Transport` for the parameters.
    """

    def __init__(self, peer_id: str, on_receive: Mapping[Channel, OnReceive], stats: dict[str, int],
                 pools: Mapping[Channel, concurrent.futures.Executor], *, run_id: str | None, max_tensor_bytes: int,
                 queue_size: int, recv_timeout: float, min_rate: float, limits: SenderLimits,
                 admitted: Admitted | None, expects: Expects | None, state_gate: StateGate | None,
                 state_wait: float) -> None:
        self.peer_id, self.on_receive, self.stats, self._pools = peer_id, on_receive, stats, pools
        self.run_id, self.max_tensor_bytes, self.recv_timeout, self.min_rate = (run_id, max_tensor_bytes,
                                                                                 recv_timeout, min_rate)
        self.limits, self.admitted, self.expects = limits, admitted, expects
        self.state_gate, self.state_wait = state_gate, state_wait
        for name in STATS:
            stats.setdefault(name, 0)
        self.inbound: set[asyncio.StreamWriter] = set()
        self._queues: dict[Channel, asyncio.Queue] = {name: asyncio.Queue(queue_size) for name in CHANNELS}
        self._slots = {name: asyncio.Semaphore(queue_size) for name in CHANNELS}  # tensors being read at once
        self.consumers = [asyncio.create_task(self._consume(name)) for name in CHANNELS]

    def close(self) -> None:
        """Close every inbound stream (their senders see EOF) and stop the consumers."""
        for writer in list(self.inbound):
            writer.close()
        for consumer in self.consumers:
            consumer.cancel()

    # ---- streams -----------------------------------------------------------------------------------------------
    async def serve(self, channel: Channel, info: Any, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        """The handler of `channel`'s protocol: serve one inbound stream's messages until it ends."""
        sender = info.peer_id.to_base58()
        if not self._open(sender, writer):
            return
        try:
            while (size := await self._next_message(reader, sender, "message")) is not None:
                if not await self._receive(channel, sender, size, reader, writer):
                    break
        finally:
            self._close(sender, writer)

    async def serve_probes(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The probe protocol's handler: read and discard each probe's filler, then acknowledge it."""
        sender = info.peer_id.to_base58()
        if not self._open(sender, writer):
            return
        try:
            while (nbytes := await self._next_message(reader, sender, "probe")) is not None:
                if not await self._receive_probe(sender, nbytes, reader, writer):
                    break
        finally:
            self._close(sender, writer)

    def _open(self, sender: str, writer: asyncio.StreamWriter) -> bool:
        """Admit a new stream of `sender`, or close it at once (not admitted, or over its stream limit)."""
        try:
            why = None if self.admitted is None or self.admitted(sender) else "sender not admitted"
        except Exception:
            logger.exception("admitted(%s) failed", sender)
            why = "sender not admitted"
        if why is None and not self.limits.open_stream(sender):
            why = f"over {self.limits.max_streams} open streams"
        if why is not None:
            self.stats["refused_streams"] += 1
            logger.warning("closed a stream from %s at once: %s", sender, why,
                           extra=event("refused_message", sender=sender, why=f"stream: {why}"))
            writer.close()
            return False
        self.stats["streams_accepted"] += 1
        self.inbound.add(writer)
        return True

    def _close(self, sender: str, writer: asyncio.StreamWriter) -> None:
        self.inbound.discard(writer)
        self.limits.close_stream(sender)
        try:
            writer.close()
        except RuntimeError:  # a handler finalised after its loop stopped (the process is exiting): nothing to close
            pass

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
            self.stats["refused"] += 1
        why = f"{what}: stream ended or stalled ({type(e).__name__})"
        if isinstance(e, TimeoutError) and what == "message":
            self.stats["refused_slow"] += 1
            why = f"{what}: stalled or slower than {self.min_rate / 1024:.0f} KiB/s"
        logger.warning("dropped a %s from %s: %s", what, sender, why,
                       extra=event("refused_message", sender=sender, why=why))

    # ---- messages ----------------------------------------------------------------------------------------------
    async def _receive(self, channel: Channel, sender: str, size: int, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> bool:
        """Read, check and queue one message of `channel`; reply. True when the stream may carry another message."""
        try:
            header = await self._read_header(reader, size)
            if header.direction not in CHANNELS[channel][1]:
                raise WireError(f"a {header.direction.name} message on the {channel} protocol")
            await self._check_expected(sender, header)
            need = bytes_needed(header)
            async with self.limits.reading(sender, channel):  # this sender's other streams wait their turn
                await self.limits.reserve(sender, channel, need)
                queued = False
                try:
                    async with self._slots[channel]:  # only now, with the size known and checked, allocate
                        buffer = bytearray(header.descriptor.nbytes)
                        await self._read_into(reader, buffer)
                        tensor = decode_tensor(header.descriptor, buffer, max_bytes=self.max_tensor_bytes)
                        if header.restore_dtype:
                            tensor = tensor.to(torch_dtype(header.restore_dtype))
                        del buffer  # the tensor shares it, unless cast back (then it is freed here)
                        await self._queues[channel].put((sender, header, tensor, need))  # waits for the consumer
                        queued = True
                finally:
                    if not queued:
                        await self.limits.release(sender, channel, need)
            self.stats["received"] += 1
            self.stats["bytes_received"] += header.descriptor.nbytes
            return await reply(writer, OK, "")
        except WireError as e:
            self.stats["refused"] += 1
            if isinstance(e, _Unexpected):
                self.stats["refused_unexpected"] += 1
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

    async def _check_expected(self, sender: str, header: HopHeader) -> None:
        """Raise `_Unexpected` unless the owner expects this message from `sender` (before anything is allocated)."""
        if self.expects is not None:
            try:
                why = self.expects(sender, header)
            except Exception as e:
                logger.exception("expects(%s, ...) failed", sender)
                why = f"cannot check it ({type(e).__name__})"
            if why is not None:
                raise _Unexpected(f"unexpected {header.direction.name.lower()}: {why}")
        if header.direction == Direction.STATE and self.state_gate is not None \
                and not await self.state_gate.wait_for(sender, self.state_wait):
            raise _Unexpected("stage state from a peer not named as its source")

    async def _read_into(self, reader: asyncio.StreamReader, buffer: bytearray) -> None:
        """Fill ``buffer`` from the stream; raise TimeoutError when the sender stalls for ``recv_timeout`` or falls
        behind ``min_rate`` after that grace (`pace_deadline`), so no sender holds a slot for long."""
        view, pos, loop = memoryview(buffer), 0, asyncio.get_running_loop()
        start = loop.time()
        async with asyncio.timeout_at(start + self.recv_timeout) as deadline:
            while pos < len(buffer):
                chunk = await reader.read(min(len(buffer) - pos, STREAM_CHUNK_BYTES))
                if not chunk:
                    raise WireError(f"stream ended after {pos} of {len(buffer)} tensor bytes")
                view[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
                deadline.reschedule(pace_deadline(start, pos, now=loop.time(), recv_timeout=self.recv_timeout,
                                                  min_rate=self.min_rate))

    async def _consume(self, channel: Channel) -> None:
        """Hand `channel`'s messages to `on_receive` on its pool, one at a time, until the pool is shut down (this
        peer is closing: a message that lands then goes nowhere, and is no error)."""
        loop = asyncio.get_running_loop()
        while True:
            sender, header, tensor, need = await self._queues[channel].get()
            try:
                try:
                    job = loop.run_in_executor(self._pools[channel], self.on_receive[channel], sender, header, tensor)
                except RuntimeError:  # "cannot schedule new futures after shutdown"
                    logger.debug("dropped a message from %s on %s: this peer is shutting down", sender, channel)
                    return
                await job
            except Exception:
                logger.exception("on_receive failed for microbatch %d from %s", header.microbatch, sender)
            finally:
                del tensor
                await self.limits.release(sender, channel, need)

    # ---- probes ------------------------------------------------------------------------------------------------
    async def _receive_probe(self, sender: str, nbytes: int, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> bool:
        """Read and discard one probe's filler; reply. True when the stream may carry another probe."""
        try:
            if nbytes > MAX_PROBE_BYTES:
                raise WireError(f"probe of {nbytes} bytes exceeds the limit of {MAX_PROBE_BYTES}")
            remaining, loop = nbytes, asyncio.get_running_loop()
            start = loop.time()
            async with asyncio.timeout_at(start + self.recv_timeout) as deadline:
                while remaining:
                    chunk = await reader.read(min(remaining, STREAM_CHUNK_BYTES))
                    if not chunk:
                        raise WireError("probe stream ended early")
                    remaining -= len(chunk)
                    deadline.reschedule(pace_deadline(start, nbytes - remaining, now=loop.time(),
                                                      recv_timeout=self.recv_timeout, min_rate=self.min_rate))
            return await reply(writer, OK, "")
        except WireError as e:
            logger.warning("refused a probe from %s: %s", sender, e,
                           extra=event("refused_message", sender=sender, why=f"probe: {e}"))
            await refuse(reader, writer, str(e))
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            self._dropped(sender, "probe", e)
        return False
