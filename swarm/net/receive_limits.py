"""What a receiver lets a sender have: which messages, how many streams, how much memory, for how long.

A `Receiver` checks every inbound message in this order, each check before its tensor's buffer is allocated:

1. `Admitted(sender)`: may this peer open streams at all (a refused stream is closed at once); and at most
   ``max_streams`` open streams per sender (`SenderLimits.open_stream`).
2. The header: schema and size limits, addressed to this peer, of this run, on its channel, a restore cast that
   only undoes compression (`swarm.wire.check_restore`).
3. `Expects(sender, header)`: the owner's say, e.g. that the sender is the one the schedule (or a valid detour)
   expects for this hop and iteration and the shape is the run's (`pipeline_shape`, `all_of`).
4. STATE only from the peers the owner named (`StateGate`).
5. One message read at a time per sender and channel, and at most ``max_pending`` bytes per sender and channel
   allocated and not yet consumed (`SenderLimits.reading`, `SenderLimits.reserve`).
6. While the bytes come: a pace of at least ``min_rate`` after a grace of ``recv_timeout`` (`pace_deadline`).

So one hostile sender holds at most one receive slot per channel, for a bounded time, and bounded memory; senders
the owner does not expect hold nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

from swarm.constants import STATE_EXPECT_SECONDS
from swarm.wire import Direction, HopHeader, torch_dtype

Admitted = Callable[[str], bool]
"""``admitted(sender_peer_id)``: whether this peer may open streams to the receiver at all. Called in the
transport's event loop for every new inbound stream: it must be quick and must not block (read a cached view)."""
Expects = Callable[[str, HopHeader], str | None]
"""``expects(sender_peer_id, header)``: why the receiver does not expect this message (None when it does).
Called in the transport's event loop after the header passed the wire checks and before the tensor's buffer is
allocated: it must be quick and must not block."""


def all_of(*checks: Expects) -> Expects:
    """One `Expects` that refuses what any of `checks` refuses (the first reason given)."""

    def check(sender: str, header: HopHeader) -> str | None:
        return next((why for c in checks if (why := c(sender, header)) is not None), None)

    return check


def pipeline_shape(shape: tuple[int, ...]) -> Expects:
    """An `Expects` check: forwards and backwards carry a tensor of exactly `shape`, the run's activation
    ``(batch_size, seq_len, dim)``, so a header cannot claim a larger one; other directions pass."""
    shape = tuple(shape)

    def check(sender: str, header: HopHeader) -> str | None:
        if header.direction in (Direction.FORWARD, Direction.BACKWARD) and tuple(header.shape) != shape:
            return f"shape {list(header.shape)}, this run's activations are {list(shape)}"
        return None

    return check


def bytes_needed(header: HopHeader) -> int:
    """Bytes a message holds on the receiver at most: its wire buffer, plus the tensor it is cast back to."""
    nbytes = header.descriptor.nbytes
    if header.restore_dtype:
        nbytes += header.descriptor.numel * torch_dtype(header.restore_dtype).itemsize
    return nbytes


def pace_deadline(start: float, received: int, *, now: float, recv_timeout: float, min_rate: float) -> float:
    """When a transfer begun at `start` that holds `received` bytes is dropped unless more arrive.

    Whichever comes first: a stall of `recv_timeout` since the last read, or falling behind the pace of `min_rate`
    bytes per second after a grace of `recv_timeout`. For a message of n bytes that is also its total deadline,
    ``start + recv_timeout + n / min_rate``.
    """
    return min(now + recv_timeout, start + recv_timeout + received / min_rate)


@dataclass
class _Sender:
    streams: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    reading: dict[str, asyncio.Lock] = field(default_factory=dict)

    def idle(self) -> bool:
        return not self.streams and not any(self.pending.values()) and not any(
            lock.locked() for lock in self.reading.values())


class SenderLimits:
    """Per-sender bounds on a receiver's streams and memory. Used only in the transport's event loop.

    :param max_streams: open inbound streams per sender, all protocols together
    :param max_pending: bytes per sender and channel allocated and not yet consumed; a message alone may exceed it
    """

    def __init__(self, *, max_streams: int, max_pending: int) -> None:
        if max_streams < 1 or max_pending < 1:
            raise ValueError(f"max_streams and max_pending must be >= 1, got {max_streams} and {max_pending}")
        self.max_streams, self.max_pending = max_streams, max_pending
        self._senders: dict[str, _Sender] = {}
        self._released = asyncio.Condition()

    def open_stream(self, sender: str) -> bool:
        """Count a new stream of `sender`; False (not counted) when it already holds `max_streams`."""
        s = self._senders.setdefault(sender, _Sender())
        if s.streams >= self.max_streams:
            return False
        s.streams += 1
        return True

    def close_stream(self, sender: str) -> None:
        s = self._senders[sender]
        s.streams -= 1
        self._forget_if_idle(sender)

    @contextlib.asynccontextmanager
    async def reading(self, sender: str, channel: str) -> AsyncIterator[None]:
        """Held while one message of `sender` on `channel` is read and queued: its other streams wait their turn,
        so a sender's streams never hold more than one receive slot of a channel."""
        s = self._senders.setdefault(sender, _Sender())
        lock = s.reading.setdefault(channel, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            self._forget_if_idle(sender)

    async def reserve(self, sender: str, channel: str, nbytes: int) -> None:
        """Wait until `sender`'s pending bytes on `channel` leave room for `nbytes` more (or it has none pending),
        then count them; `release` them once the message is consumed or dropped."""
        s = self._senders.setdefault(sender, _Sender())
        async with self._released:
            await self._released.wait_for(lambda: not s.pending.get(channel) or
                                          s.pending[channel] + nbytes <= self.max_pending)
            s.pending[channel] = s.pending.get(channel, 0) + nbytes

    async def release(self, sender: str, channel: str, nbytes: int) -> None:
        s = self._senders[sender]
        s.pending[channel] -= nbytes
        self._forget_if_idle(sender)
        async with self._released:
            self._released.notify_all()

    def pending(self, sender: str, channel: str) -> int:
        """Bytes of `sender` on `channel` allocated and not yet consumed."""
        s = self._senders.get(sender)
        return s.pending.get(channel, 0) if s is not None else 0

    def _forget_if_idle(self, sender: str) -> None:
        s = self._senders.get(sender)
        if s is not None and s.idle():
            del self._senders[sender]


class StateGate:
    """Which peers may send this peer a stage's state: only those it names, each for a while.

    Stage state is the largest message (a stage's weights and optimizer moments) and is kept until used, so a
    receiver takes it only from the peers the schedule names as its source (`expect`). Thread-safe: the owner
    names sources from its own threads while the transport's loop checks and waits.
    """

    POLL = 0.1

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def expect(self, peers: Iterable[str], *, timeout: float = STATE_EXPECT_SECONDS) -> None:
        """Take stage state from `peers` for the next `timeout` seconds (on top of those already named)."""
        until = time.monotonic() + timeout
        with self._lock:
            for peer in peers:
                self._until[peer] = max(until, self._until.get(peer, 0.0))

    def forget(self, peers: Iterable[str] | None = None) -> None:
        """Take no more stage state from `peers` (from anyone, when None): the owner has its stage's state."""
        with self._lock:
            if peers is None:
                self._until.clear()
            for peer in peers or ():
                self._until.pop(peer, None)

    def admits(self, sender: str) -> bool:
        now = time.monotonic()
        with self._lock:
            for peer in [p for p, until in self._until.items() if until < now]:
                del self._until[peer]
            return sender in self._until

    async def wait_for(self, sender: str, timeout: float) -> bool:
        """Whether `sender` is (or within `timeout` seconds becomes) a named source; holds no buffer meanwhile."""
        end = time.monotonic() + timeout
        while not self.admits(sender):
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(min(self.POLL, max(0.0, end - time.monotonic())))
        return True
