"""`SendTimes`: a peer's pipeline sends against what its links' estimates predict.

The plan's link costs come from probes (`swarm.net.link_probe`), and the periodic refresh re-measures the stalest
links only every few minutes: a link that slows mid-run (a volunteer's upload taken by another job, a congested
route) or recovers goes on being planned at its old cost for that long. Every pipeline message is a measurement of
its link too: a send's seconds against the estimate's round trip plus its bytes at the estimated goodput. Where the
median of a link's last `SEND_WINDOW` sends is `OFF_RATIO` times off that prediction either way, and off by
`OFF_FLOOR` seconds at least, the link is due for a re-measurement now (`LinkWatch.sent`); the probe decides, so a
send slowed by something else (a receiver whose inbox is full) costs one probe and changes nothing. A link
re-measured is not due again for `RECHECK_SECONDS`, twice as long each time the probe found it unchanged.

Where this peer sent recently on `MIN_OTHER_LINKS` other links or more, the link must also be `OFF_RATIO` times off
what they ran at (the median of their sends over their predictions): a slowdown every link of the sender shares is
the sender's own (its CPU, its uplink, a loaded host), which re-measuring its links one by one would turn into a
table where the links probed lately look slower than the others, and re-plans chasing that (seen at 20 peers on 2
cores: links probed at 10 ms and 10-35 MB/s re-measured at 30-65 ms and 3-13 MB/s, two re-plans in a run without
churn).
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
MIN_OTHER_LINKS = 2
"""Other links with a recent full window of sends that make the sender's usual pace (fewer: the prediction alone)."""
RECENT_SECONDS = 60.0
"""A link's last full window counts towards the sender's usual pace for this long."""
MAX_RECHECK_SECONDS = 300.0
"""...doubled each time its re-measurement found it unchanged, up to this (the periodic refresh's period): sends
slowed by their sender's own load (20 peers' transports on two cores) stay off while the probe finds the link as it
was, and a probe every 30 s would add to that load for nothing."""


def off(a: float, b: float) -> bool:
    """Whether `a` and `b` (positive) are `OFF_RATIO` times apart, either way."""
    return max(a, b) >= OFF_RATIO * min(a, b)


def predicted_seconds(estimate: LinkEstimate, nbytes: int) -> float:
    """A send's seconds on a link of `estimate`: its round trip (the send waits for the receiver's answer) and its
    bytes at the link's goodput."""
    return 2 * estimate.latency_s + nbytes / estimate.bytes_per_s


class SendTimes:
    """Recent pipeline send times per receiving peer (thread-safe: every sender thread notes its sends)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sends: dict[str, deque[tuple[float, float]]] = {}
        """Per link, its last sends since it was last due: (seconds taken, seconds predicted)."""
        self._pace: dict[str, tuple[float, float]] = {}
        """Per link, its last full window's sends over their predictions (the median), and when."""
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
            now = self._clock()
            window = self._sends.setdefault(peer, deque(maxlen=SEND_WINDOW))
            window.append((seconds, predicted))
            if len(window) < SEND_WINDOW:
                return False
            self._pace[peer] = (statistics.median(s / p for s, p in window), now)
            if now - self._rechecked.get(peer, -math.inf) < self._wait.get(peer, RECHECK_SECONDS):
                return False
            took = statistics.median(s for s, _ in window)
            expected = statistics.median(p for _, p in window)
            if abs(took - expected) < OFF_FLOOR or not off(took, expected):
                return False
            usual = self._usual_pace(peer, now)
            if usual is not None and not off(took, usual * expected):
                return False  # as off as the sender's other links: its own load, not this link
            self._rechecked[peer] = now
            window.clear()
            return True

    def claim(self, peer: str) -> bool:
        """Whether the link to `peer` may be re-measured now for another sign than its sends (a probe of the peer
        went unanswered while it was in the middle of a hop): not within its recheck wait; claimed, it waits again."""
        with self._lock:
            now = self._clock()
            if now - self._rechecked.get(peer, -math.inf) < self._wait.get(peer, RECHECK_SECONDS):
                return False
            self._rechecked[peer] = now
            self._sends.pop(peer, None)
            return True

    def _usual_pace(self, peer: str, now: float) -> float | None:
        """The median, over this sender's other links whose last full window of sends is recent, of those sends'
        seconds over their predictions; None with fewer than `MIN_OTHER_LINKS` of them."""
        paces = [pace for other, (pace, when) in self._pace.items() if other != peer and now - when <= RECENT_SECONDS]
        return statistics.median(paces) if len(paces) >= MIN_OTHER_LINKS else None

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
