"""`MessageJitter`: how much the messages a peer receives deviate from their link's typical time.

The planner's links are typical times (median probes); on a shared or loaded network single messages arrive tens
of milliseconds early or late, and where microbatches meet at a peer that reorders its queue against the plan.
Each message's time is compared with the median of its own link's recent ones, so what is kept is the deviation
only: for a pipeline message, arrival minus the sender's `sent_at` stamp, where the clocks' constant offset and the
transfer time cancel against the link's median; for a probe, half the round trip. The peer publishes quantiles of
the deviations in its record; the scheduler pools them into the cost tables' `jitter`.
"""

from __future__ import annotations

import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable

import numpy as np

from scheduler.constants import JITTER_QUANTILES, MAX_JITTER_SECONDS
from scheduler.costs import jitter_quantiles

LINK_WINDOW = 32
"""Recent times per link that its median is taken over."""
MIN_LINK_SAMPLES = 5
"""Times a link needs before its deviations count (the median of fewer is itself noise)."""
POOL_SIZE = 512
"""Recent deviations kept over all links: the last few iterations' messages."""
MAX_TRACKED_LINKS = 256
"""Links remembered at once (the least recently heard from is forgotten first)."""


class MessageJitter:
    """Deviations of recent message times from their link's median (thread-safe: the transport thread observes,
    the heartbeat reads)."""

    def __init__(self, *, link_window: int = LINK_WINDOW, pool_size: int = POOL_SIZE) -> None:
        self._links: OrderedDict[str, deque[float]] = OrderedDict()
        self._link_window = link_window
        self._pool: deque[float] = deque(maxlen=pool_size)
        self._lock = threading.Lock()

    def observe(self, link: str, seconds: Iterable[float] | float) -> None:
        """Times of one or more messages on `link` (any key naming the sender and kind of message)."""
        times = [seconds] if isinstance(seconds, (int, float)) else list(seconds)
        times = [float(t) for t in times if np.isfinite(t)]
        if not times:
            return
        with self._lock:
            window = self._links.pop(link, None) or deque(maxlen=self._link_window)
            self._links[link] = window
            while len(self._links) > MAX_TRACKED_LINKS:
                self._links.popitem(last=False)
            window.extend(times)
            if len(window) < MIN_LINK_SAMPLES:
                return
            typical = statistics.median(window)
            for t in times[-len(window):]:
                if abs(t - typical) <= MAX_JITTER_SECONDS:
                    self._pool.append(t - typical)

    def quantiles(self, k: int = JITTER_QUANTILES) -> tuple[float, ...]:
        """`k` evenly spaced quantiles (midpoints) of the recent deviations, seconds; () until `k` are known."""
        with self._lock:
            pool = np.array(self._pool)
        if len(pool) < k:
            return ()
        return tuple(round(q, 6) for q in jitter_quantiles(pool, k))

    def __len__(self) -> int:
        with self._lock:
            return len(self._pool)
