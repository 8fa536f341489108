"""`StreamRoutes`: which way a new transport stream goes, direct or through a relay, on both of its ends.

A route here is a stream's way between two peers (not a pipeline route). A peer behind NAT names its relays in the
circuit addresses of its record (`swarm.net.reachability`); a relay carries streams to it (`swarm.net.forwarding`).
The sending end decides, per destination, whether to dial it, to race a dial against its relay, or (for a while
after the relay won) to go through the relay first. The receiving end serves a forwarded stream as its sender's
only when a relay this peer itself announces carries it. Design and measurements: ``docs/nat.md``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from hivemind.p2p import P2P, PeerID

from swarm.constants import MAX_LINKS
from swarm.net.forwarding import ForwardError, open_forwarded, origin_info, read_preamble, relays_in
from swarm.net.idle_streams import IdleStream
from swarm.net.transport_errors import PeerUnreachable

logger = logging.getLogger(__name__)

DIRECT_DIAL_TIMEOUT = 3.0
"""Seconds a direct stream to a peer announcing a relay may take to open before the relay carries it."""
VIA_RELAY_FOR = 300.0
"""Seconds a peer reached only through its relay is sent to through it first, skipping the direct dial."""
RELAYS_CACHE = 10.0
"""Seconds a peer's relays (this peer's own: whom it takes forwarded streams from) are remembered before a new read
(the hook may read the DHT)."""

Serve = Callable[[Any, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
"""A stream handler, as p2pd calls it: (info with the origin's ``peer_id``, reader, writer)."""


def _close_if_opened(task: asyncio.Future) -> None:
    """Done-callback of a stream opening that lost a race: close the stream if it opened after all."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


class StreamRoutes:
    """Opens the transport's new streams to peers and vets the forwarded streams that reach this peer.

    Contract:

    - `open` returns a new stream to a peer on a protocol. To a peer whose record names no relay it dials directly.
      To one that names a relay, a direct dial (given up after ``direct_timeout``) and a stream through the relay
      race; the direct stream wins a tie, the loser is closed. A peer reached through its relay is opened through
      it first for ``via_relay_for`` seconds (`via_relay`), skipping the dial; should the relay then fail to reach
      it, the race runs again. Raises `PeerUnreachable` when no way opens (the message was certainly not sent).
    - `relay_instead` is told that a direct stream to a peer died midway: from then on it goes through the peer's
      relay first, if it names one.
    - `serve_forwarded` serves a forwarded stream as its sender's (the preamble names it) only when it comes from a
      relay that this peer's own record names: nobody else may speak for a sender. Others are closed unread.
    - A peer's relay, and this peer's own relays, are read through ``addresses`` at most every ``relays_cache``
      seconds; a peer's lookup that fails counts as no relay. Every opened stream counts in
      ``stats["streams_opened"]``.

    Methods run on the event loop of the ``p2p`` client; ``addresses`` runs off it, in the loop's executor.

    :param p2p: this peer's client of its p2pd
    :param addresses: peer id -> the circuit addresses its record announces (its relays); None: nobody has a relay,
      and no forwarded stream is accepted
    :param stats: counters shared with the owner; ``"streams_opened"`` is incremented
    """

    def __init__(self, p2p: P2P, addresses: Callable[[str], Sequence[str]] | None,
                 stats: MutableMapping[str, int] | None = None, *, direct_timeout: float = DIRECT_DIAL_TIMEOUT,
                 via_relay_for: float = VIA_RELAY_FOR, relays_cache: float = RELAYS_CACHE) -> None:
        self.p2p, self.addresses = p2p, addresses
        self.peer_id: str = p2p.peer_id.to_base58()
        self.stats = stats if stats is not None else {}
        self.stats.setdefault("streams_opened", 0)
        self.direct_timeout, self.via_relay_for, self.relays_cache = direct_timeout, via_relay_for, relays_cache
        self._via_relay: dict[str, float] = {}  # peer -> until when its streams go through its relay first
        self._own_relays: tuple[float, frozenset[str]] = (-relays_cache, frozenset())
        self._relay_lookups: dict[str, tuple[float, str | None]] = {}  # peer -> (when read, the relay it names)

    def via_relay(self, peer_id: str) -> bool:
        """Whether new streams to `peer_id` go through its relay first (it was reached only that way lately)."""
        return self._via_relay.get(peer_id, 0.0) > time.monotonic()

    # ---- sending end -------------------------------------------------------------------------------------------
    async def open(self, peer_id: str, protocol: str) -> IdleStream:
        """A new stream to `peer_id`: direct, or carried by the relay its record names when it cannot be dialled.

        To a peer that names a relay, a direct dial and one through the relay race (a home peer's neighbour reaches
        it directly, everyone else only through the relay, and nobody should wait out a dial to learn which); the
        direct stream wins a tie. One reached through its relay is sent to through it first for `via_relay_for`."""
        relay = await self.relay_of(peer_id)
        if relay is None:
            try:
                return await self._open_direct(peer_id, protocol)
            except (TimeoutError, asyncio.CancelledError):
                raise
            except Exception as e:  # p2pd reports unreachable peers with assorted error types
                raise PeerUnreachable(f"cannot open a stream to {peer_id}: {type(e).__name__}: {e}") from None
        if self.via_relay(peer_id):
            try:
                return await self._open_forwarded(relay, peer_id, protocol)
            except ForwardError as e:  # the relay lost it: perhaps it is reachable directly now
                logger.info("%s; dialling %s directly", e, peer_id)
                self._via_relay.pop(peer_id, None)
        direct = asyncio.ensure_future(asyncio.wait_for(self._open_direct(peer_id, protocol), self.direct_timeout))
        relayed = asyncio.ensure_future(self._open_forwarded(relay, peer_id, protocol))
        pending, errors = {direct, relayed}, []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                won = [t for t in (direct, relayed) if t in done and t.exception() is None]
                errors += [f"{type(t.exception()).__name__}: {t.exception()}" for t in done if t.exception()]
                if won:
                    for other in won[1:]:
                        other.result().close()
                    if won[0] is relayed:
                        logger.info("%s reached through its relay %s", peer_id, relay)
                        self._via_relay[peer_id] = time.monotonic() + self.via_relay_for
                    return won[0].result()
        finally:
            for task in pending:
                task.cancel()
                task.add_done_callback(_close_if_opened)
        raise PeerUnreachable(f"cannot open a stream to {peer_id}, directly nor through its relay {relay}: "
                              f"{'; '.join(errors)}")

    async def relay_instead(self, peer_id: str) -> bool:
        """Whether to send to `peer_id` through its relay from now on, a direct stream to it having failed: True
        when it names a relay and was not sent to through it already (then it is, for `via_relay_for`)."""
        if self.via_relay(peer_id) or await self.relay_of(peer_id) is None:
            return False
        self._via_relay[peer_id] = time.monotonic() + self.via_relay_for
        return True

    async def relay_of(self, peer_id: str) -> str | None:
        """The relay `peer_id` announces itself through, if any (read at most every `relays_cache` seconds)."""
        if self.addresses is None:
            return None
        read_at, relay = self._relay_lookups.get(peer_id, (-self.relays_cache, None))
        if time.monotonic() - read_at <= self.relays_cache:
            return relay
        try:
            found = await asyncio.get_running_loop().run_in_executor(None, self.addresses, peer_id)
            relay = next(iter(relays_in(found)), None)
        except Exception as e:
            logger.debug("addresses of %s unknown: %s", peer_id, e)
            relay = None
        if len(self._relay_lookups) > 4 * MAX_LINKS:  # peers come and go: forget the oldest lookups
            for stale in sorted(self._relay_lookups, key=lambda p: self._relay_lookups[p][0])[:MAX_LINKS]:
                del self._relay_lookups[stale]
        self._relay_lookups[peer_id] = (time.monotonic(), relay)
        return relay

    async def _open_direct(self, peer_id: str, protocol: str) -> IdleStream:
        _, reader, writer = await self.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), protocol)
        self.stats["streams_opened"] += 1
        return IdleStream(reader, writer)

    async def _open_forwarded(self, relay: str, peer_id: str, protocol: str) -> IdleStream:
        reader, writer = await open_forwarded(self.p2p, relay, peer_id, protocol)
        self.stats["streams_opened"] += 1
        return IdleStream(reader, writer)

    # ---- receiving end -----------------------------------------------------------------------------------------
    async def serve_forwarded(self, serve: Serve, info: Any, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        """A stream a relay carries from another peer (the handler of a forwarded protocol, with `serve` bound):
        served by `serve` as that peer's if the relay is one this peer announces itself through (nobody else may
        speak for a sender), closed otherwise."""
        relay = info.peer_id.to_base58()
        try:
            if relay not in await self.trusted_relays():
                raise ForwardError(f"{relay} is not a relay of this peer")
            sender = (await read_preamble(reader, ("sender",)))["sender"]
        except ForwardError as e:
            logger.warning("refused a forwarded stream from %s: %s", relay, e)
            writer.close()
            return
        await serve(origin_info(sender), reader, writer)

    async def trusted_relays(self) -> frozenset[str]:
        """The relays this peer's own record names: the only ones whose forwarded streams it serves."""
        read_at, relays = self._own_relays
        if time.monotonic() - read_at > self.relays_cache and self.addresses is not None:
            try:
                relays = frozenset(relays_in(await asyncio.get_running_loop().run_in_executor(
                    None, self.addresses, self.peer_id)))
            except Exception as e:  # the DHT did not answer: keep the relays read last (none before the first read)
                logger.warning("could not read this peer's own record for its relays: %s", e)
                return relays
            self._own_relays = (time.monotonic(), relays)
        return relays
