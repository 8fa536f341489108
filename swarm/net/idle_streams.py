"""`IdleStreams`: the streams a sender keeps open to each receiver between messages.

Opening a p2pd stream costs ~1.8 ms, more than a whole 1 KiB message takes on an open one, so a sender keeps a
few idle streams per (receiver, protocol) and sends its next message on one of them. A stream carries one message
at a time: it is checked out for the whole exchange and checked back in only once its message was accepted. Used
from the transport's event-loop thread only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from swarm.constants import SEND_CONCURRENCY

MAX_IDLE_STREAMS = SEND_CONCURRENCY
"""Idle streams kept per (receiver, protocol): one per concurrent send, so a peer's sends never reopen streams;
concurrent sends beyond that open streams that are closed after."""
IDLE_CLOSE = 30.0
"""A sender closes a stream unused this long (receivers close theirs after ``recv_timeout``, 60 s by default)."""
SWEEP_PERIOD = 5.0
"""How often a sender looks for idle streams to close (dead, or unused for ``IDLE_CLOSE``)."""

Key = tuple[str, str]
"""(receiver peer id, protocol)."""


@dataclasses.dataclass
class IdleStream:
    """One p2pd stream to a receiver, owned by one exchange at a time."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    last_used: float = 0.0

    def alive(self) -> bool:
        return not (self.reader.at_eof() or self.reader.exception() is not None or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class IdleStreams:
    """Idle streams by (receiver, protocol), most recently used last; dead and stale ones are closed."""

    def __init__(self) -> None:
        self._idle: dict[Key, list[IdleStream]] = {}
        self._last_sweep = time.monotonic()

    def checkout(self, key: Key) -> IdleStream | None:
        """A live idle stream for `key` (the most recently used, the most likely alive), or None."""
        idle = self._idle.get(key)
        while idle:
            stream = idle.pop()
            if stream.alive():
                return stream
            stream.close()
        return None

    def checkin(self, key: Key, stream: IdleStream) -> None:
        """`stream` carried its message: keep it for the next one (or close it, past MAX_IDLE_STREAMS)."""
        now = time.monotonic()
        stream.last_used = now
        idle = self._idle.setdefault(key, [])
        if len(idle) < MAX_IDLE_STREAMS:
            idle.append(stream)
        else:
            stream.close()
        if now - self._last_sweep > SWEEP_PERIOD:
            self._last_sweep = now
            for k in list(self._idle):
                keep = [s for s in self._idle[k] if s.alive() and now - s.last_used < IDLE_CLOSE]
                for s in self._idle[k]:
                    if s not in keep:
                        s.close()
                if keep:
                    self._idle[k] = keep
                else:
                    del self._idle[k]

    def close(self, key: Key) -> None:
        """Close the idle streams of `key` (its receiver left, or closed one of them)."""
        for stream in self._idle.pop(key, []):
            stream.close()

    def close_all(self) -> None:
        for streams in self._idle.values():
            for stream in streams:
                stream.close()
        self._idle.clear()
