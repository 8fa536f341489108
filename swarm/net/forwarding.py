"""Forwarding: a public peer carries the transport's streams to a peer that cannot be dialled.

A peer behind NAT accepts no inbound connection, but keeps the one it opened to its relay (the coordinator started
with ``--relay``; it holds a circuit-relay reservation there, which keeps that connection up). libp2p's own circuit
relay v2 is a *limited* relay: p2pd resets a relayed connection after 128 KiB in either direction, whatever its
``-relayDataLimit`` (measured: ``docs/nat.md``), so it cannot carry activations. Instead the relay forwards
streams itself:

- the sender opens a stream to the relay on `FORWARD_PROTOCOL` and writes a preamble naming the destination and the
  protocol (one of the transport's);
- the relay checks that both are members of the run, opens a stream to the destination on the protocol's
  forwarded twin (`forwarded_protocol`) over the connection the destination opened, writes a preamble naming the
  sender, answers the sender with one status byte, and then copies bytes both ways until either side closes;
- the destination serves that stream as one from the sender, but only when it comes from a relay it announces
  itself through (its own circuit addresses name them): nobody else may speak for a sender.

So every kind of traffic (hops, averaging, state transfer, probes) works through the relay unchanged, and a probe
through it measures what the relayed link costs. The relay sees the bytes, as any relay does; it is the run's
coordinator, which the run trusts already.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import msgpack
from hivemind import DHT
from hivemind.p2p import P2P, PeerID

from swarm.constants import CONNECT_TIMEOUT, MAX_ERROR_CHARS, MAX_ID_CHARS, STREAM_CHUNK_BYTES
from swarm.net.channels import PROTOCOLS
from swarm.net.p2p_client import own_p2p

logger = logging.getLogger(__name__)

FORWARD_PROTOCOL = "skippipe.forward.v1"
"""A sender's stream to a relay, to be carried on to the destination its preamble names."""
MAX_PREAMBLE_BYTES = 512
PREAMBLE_TIMEOUT = 10.0
"""Seconds to read a preamble or the relay's answer."""
MAX_STREAMS_PER_PEER = 64
"""Forwarded streams one sender may hold open through a relay at once."""
MAX_STREAMS = 2048
"""Forwarded streams a relay carries at once."""
OPENED, REFUSED = 0, 1


class ForwardError(RuntimeError):
    """A forwarded stream could not be set up (bad preamble, refused by the relay, destination unreachable)."""


def relays_in(addresses: Iterable[str]) -> list[str]:
    """The relays named by circuit addresses (``.../p2p/RELAY/p2p-circuit/p2p/PEER``), in order, each once."""
    out: list[str] = []
    for maddr in addresses:
        head, sep, _ = str(maddr).partition("/p2p-circuit")
        relay = head.rpartition("/p2p/")[2] if sep and "/p2p/" in head else ""
        if relay and relay not in out:
            out.append(relay)
    return out


def forwarded_protocol(protocol: str) -> str:
    """The protocol a relay opens to the destination for a stream of `protocol`."""
    return f"{protocol}.forwarded"


def encode_preamble(**fields: str) -> bytes:
    body = msgpack.packb(fields, use_bin_type=True)
    if len(body) > MAX_PREAMBLE_BYTES:
        raise ValueError(f"preamble of {len(body)} bytes exceeds {MAX_PREAMBLE_BYTES}")
    return len(body).to_bytes(2, "big") + body


def decode_preamble(body: bytes, keys: tuple[str, ...]) -> dict[str, str]:
    """The preamble's fields, exactly `keys`, each a bounded string; ForwardError otherwise. A peer id field (every
    key but "protocol") must parse as one; "protocol" must be one of the transport's."""
    try:
        fields = msgpack.unpackb(body, raw=False, strict_map_key=True, max_str_len=MAX_PREAMBLE_BYTES,
                                 max_bin_len=0, max_array_len=0, max_map_len=8, max_ext_len=0)
    except Exception as e:
        raise ForwardError(f"malformed preamble: {type(e).__name__}") from None
    if not isinstance(fields, dict) or set(fields) != set(keys):
        raise ForwardError(f"a preamble needs exactly the fields {sorted(keys)}")
    for key, value in fields.items():
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
            raise ForwardError(f"preamble field {key!r} is not a short string")
        if key == "protocol":
            if value not in PROTOCOLS:
                raise ForwardError(f"{value!r:.80} is not a protocol of the transport")
            continue
        try:
            PeerID.from_base58(value)
        except Exception:
            raise ForwardError(f"preamble field {key!r} is not a peer id") from None
    return fields


async def read_preamble(reader: asyncio.StreamReader, keys: tuple[str, ...],
                        timeout: float = PREAMBLE_TIMEOUT) -> dict[str, str]:
    async def read() -> bytes:
        size = int.from_bytes(await reader.readexactly(2), "big")
        if not 0 < size <= MAX_PREAMBLE_BYTES:
            raise ForwardError(f"a preamble of {size} bytes")
        return await reader.readexactly(size)
    try:
        body = await asyncio.wait_for(read(), timeout)
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
        raise ForwardError(f"no preamble: {type(e).__name__}") from None
    return decode_preamble(body, keys)


def origin_info(sender: str) -> Any:
    """What a transport handler reads of a stream's origin (its ``peer_id``), for a forwarded stream's sender."""
    return SimpleNamespace(peer_id=PeerID.from_base58(sender))


async def open_forwarded(p2p: P2P, relay: str, to: str, protocol: str, timeout: float = CONNECT_TIMEOUT
                         ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to `to` on `protocol`, carried by `relay`; ForwardError (with the relay's reason) if it refused or
    could not reach `to`."""
    _, reader, writer = await asyncio.wait_for(
        p2p.call_binary_stream_handler(PeerID.from_base58(relay), FORWARD_PROTOCOL), timeout)
    try:
        try:
            writer.write(encode_preamble(to=to, protocol=protocol))
            await writer.drain()
        except ConnectionError:
            pass  # the relay may have refused (a stranger) and closed before reading: its answer says why
        head = await asyncio.wait_for(reader.readexactly(3), timeout)
        if head[0] != OPENED:
            reason = await asyncio.wait_for(reader.readexactly(min(int.from_bytes(head[1:], "big"),
                                                                    MAX_ERROR_CHARS * 4)), timeout)
            raise ForwardError(f"relay {relay} cannot reach {to}: {reason.decode('utf-8', 'replace')}")
    except BaseException as e:
        writer.close()
        if isinstance(e, (asyncio.IncompleteReadError, ConnectionError, TimeoutError)):
            raise ForwardError(f"relay {relay} closed the stream to {to}: {type(e).__name__}") from None
        raise
    return reader, writer


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str = "") -> None:
    data = reason[:MAX_ERROR_CHARS].encode()
    writer.write(bytes([status]) + len(data).to_bytes(2, "big") + data)
    await writer.drain()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    moved = 0
    while chunk := await reader.read(STREAM_CHUNK_BYTES):
        writer.write(chunk)
        await writer.drain()
        moved += len(chunk)
    return moved


class Forwarder:
    """The relay's side: carries members' streams to members that cannot be dialled, on its own event loop thread.

    :param dht: the relaying node's started DHT (its p2pd is shared)
    :param admitted: whether a peer is a member of the run (both the sender and the destination must be); it may
      read the DHT (it runs off the event loop)
    """

    def __init__(self, dht: DHT, admitted: Callable[[str], bool], *, max_per_peer: int = MAX_STREAMS_PER_PEER,
                 max_streams: int = MAX_STREAMS, timeout: float = CONNECT_TIMEOUT) -> None:
        self.admitted, self.max_per_peer, self.max_streams, self.timeout = admitted, max_per_peer, max_streams, timeout
        self.open: Counter[str] = Counter()
        """Sender -> its forwarded streams open now."""
        self.stats = {"forwarded": 0, "refused": 0, "bytes": 0}
        self._copies: set[asyncio.Future] = set()
        """The byte copies of the streams being carried (both directions of each)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="skippipe-forwarder", daemon=True)
        self._thread.start()
        self._p2p: P2P | None = None
        try:
            self._run(self._start(dht), timeout)
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self, dht: DHT) -> None:
        self._p2p = await own_p2p(dht)
        await self._p2p.add_binary_stream_handler(FORWARD_PROTOCOL, self._serve)

    def shutdown(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._run(self._shutdown(), self.timeout)
        except Exception as e:
            logger.debug("forwarder shutdown: %s", e)
        finally:
            self._stop_loop()

    async def _shutdown(self) -> None:
        try:
            await asyncio.wait_for(self._p2p.remove_binary_stream_handler(FORWARD_PROTOCOL), 2.0)
        except Exception as e:
            logger.debug("removing the forwarding handler: %s", e)
        finally:
            carried = list(self._copies)
            for task in carried:  # the streams still being carried end with the relay
                task.cancel()
            await asyncio.gather(*carried, return_exceptions=True)
            await self._p2p.shutdown()

    def _run(self, coro, timeout: float) -> Any:
        try:
            return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop).result()
        except (TimeoutError, concurrent.futures.TimeoutError):
            raise RuntimeError(f"forwarder: timed out after {timeout:.0f}s") from None

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _serve(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sender = info.peer_id.to_base58()
        loop = asyncio.get_running_loop()
        why = self._refusal(sender)  # counted from the start: a stream still writing its preamble holds a slot
        self.open[sender] += 1
        try:
            to = protocol = ""
            if why is None:  # read before any answer: a stream closed with unread bytes is reset, answer and all
                try:
                    fields = await read_preamble(reader, ("to", "protocol"))
                    to, protocol = fields["to"], fields["protocol"]
                except ForwardError as e:
                    why = str(e)
            if why is None and not await loop.run_in_executor(None, self.admitted, sender):
                why = "the sender is not a member of the run"
            if why is None and (to == sender or not await loop.run_in_executor(None, self.admitted, to)):
                why = "the destination is not a member of the run"
            if why is not None:
                self.stats["refused"] += 1
                logger.info("not forwarding a stream of %s: %s", sender, why)
                await _answer(writer, REFUSED, why)
                return
            await self._carry(sender, to, protocol, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            logger.debug("a forwarded stream of %s ended: %s", sender, e)
        finally:
            self.open[sender] -= 1
            if not self.open[sender]:
                del self.open[sender]
            writer.close()

    def _refusal(self, sender: str) -> str | None:
        if self.open[sender] >= self.max_per_peer:
            return f"{self.max_per_peer} streams of this sender are forwarded already"
        if sum(self.open.values()) >= self.max_streams:
            return "the relay carries as many streams as it can"
        return None

    async def _carry(self, sender: str, to: str, protocol: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            _, dst_reader, dst_writer = await asyncio.wait_for(
                self._p2p.call_binary_stream_handler(PeerID.from_base58(to), forwarded_protocol(protocol)),
                self.timeout)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as e:
            self.stats["refused"] += 1
            await _answer(writer, REFUSED, f"cannot open a stream to it: {type(e).__name__}: {e}")
            return
        try:
            dst_writer.write(encode_preamble(sender=sender))
            await dst_writer.drain()
            await _answer(writer, OPENED)
            self.stats["forwarded"] += 1
            tasks = [asyncio.ensure_future(_copy(reader, dst_writer)),
                     asyncio.ensure_future(_copy(dst_reader, writer))]
            for task in tasks:
                self._copies.add(task)
                task.add_done_callback(self._copies.discard)
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            for task in done:
                if not task.cancelled() and task.exception() is None:
                    self.stats["bytes"] += task.result()
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            logger.debug("a forwarded stream %s -> %s ended: %s", sender, to, e)
        finally:
            dst_writer.close()
