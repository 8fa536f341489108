"""`SendTimes`: a peer's pipeline sends against what its links' estimates predict.

The plan's link costs come from probes (`swarm.net.link_probe`), and the periodic refresh re-measures the stalest
links only every few minutes: a link that slows mid-run (a volunteer's upload taken by another job, a congested
route) or recovers goes on being planned at its old cost for that long. Every pipeline message is a measurement of
its link too: a send's seconds against the estimate's round trip plus its bytes at the estimated goodput. Where the
median of a link's last `SEND_WINDOW` sends is `OFF_RATIO` times off that prediction either way, and off by
`OFF_FLOOR` seconds at least, the link is due for a re-measurement now (`LinkWatch.sent`); the probe decides, so a
send slowed by something else (a receiver whose inbox is full) costs one probe and changes nothing. A link
re-measured is not due again for `RECHECK_SECONDS`, twice as long each time the probe found it unchanged.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from swarm.net.link_probe import LinkEstimate

SEND_WINDOW = 3
"""Recent sends per link whose median is compared with the prediction (one slow send is noise)."""
OFF_RATIO = 3.0
"""How many times off the prediction a link's sends must be, either way. Messages run 1.1-1.6x their link's table
time on a loaded 2-core host (BENCHMARKS.md, 2026-12-05), more in their tail."""
OFF_FLOOR = 0.25
"""...and by this many seconds at least (a loopback link going from 2 to 20 ms is not worth a probe)."""
RECHECK_SECONDS = 30.0
"""A link re-measured for its sends is not due again before this..."""
MAX_RECHECK_SECONDS = 300.0
"""...doubled each time its re-measurement found it unchanged, up to this (the periodic refresh's period): sends
slowed by their sender's own load (20 peers' transports on two cores) stay off while the probe finds the link as it
was, and a probe every 30 s would add to that load for nothing."""


def predicted_seconds(estimate: LinkEstimate, nbytes: int) -> float:
    """A send's seconds on a link of `estimate`: its round trip (the send waits for the receiver's answer) and its
    bytes at the link's goodput."""
    return 2 * estimate.latency_s + nbytes / estimate.bytes_per_s


class SendTimes:
    """Recent pipeline send times per receiving peer (thread-safe: every sender thread notes its sends)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sends: dict[str, deque[tuple[float, float]]] = {}
        self._rechecked: dict[str, float] = {}
        self._wait: dict[str, float] = {}
        self._lock = threading.Lock()

    def due(self, peer: str, seconds: float, nbytes: int, estimate: LinkEstimate | None) -> bool:
        """Note a send of `nbytes` to `peer` that took `seconds`; True once the link's last sends are off the
        `estimate` enough to re-measure it (and it was not re-measured for them lately). A link never measured has
        nothing to be off from."""
        if estimate is None or not math.isfinite(seconds) or seconds < 0 or nbytes < 0:
            return False
        predicted = predicted_seconds(estimate, nbytes)
        if not math.isfinite(predicted) or predicted <= 0:
            return False
        with self._lock:
            window = self._sends.setdefault(peer, deque(maxlen=SEND_WINDOW))
            window.append((seconds, predicted))
            waited = self._clock() - self._rechecked.get(peer, -math.inf)
            if len(window) < SEND_WINDOW or waited < self._wait.get(peer, RECHECK_SECONDS):
                return False
            took = statistics.median(s for s, _ in window)
            expected = statistics.median(p for _, p in window)
            if abs(took - expected) < OFF_FLOOR or max(took, expected) < OFF_RATIO * min(took, expected):
                return False
            self._rechecked[peer] = self._clock()
            window.clear()
            return True

    def remeasured(self, peer: str, changed: bool) -> None:
        """The link to `peer`, due, was re-measured: `changed` (the probe found it moved) keeps the next re-check
        `RECHECK_SECONDS` away; unchanged doubles that wait, up to `MAX_RECHECK_SECONDS`."""
        with self._lock:
            wait = self._wait.get(peer, RECHECK_SECONDS)
            self._wait[peer] = RECHECK_SECONDS if changed else min(MAX_RECHECK_SECONDS, 2 * wait)


def moved(before: LinkEstimate | None, after: LinkEstimate, factor: float = 1.5) -> bool:
    """Whether a link's estimate moved `factor` times or more, in latency or in goodput (or was never measured)."""
    if before is None:
        return True
    pairs = ((before.latency_s, after.latency_s), (before.bytes_per_s, after.bytes_per_s))
    return any(max(a, b) >= factor * max(min(a, b), 1e-9) for a, b in pairs)
