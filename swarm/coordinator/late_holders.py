"""`LateHolders`: data holders whose Done report of the iteration in progress is late against the others'.

A frozen data holder (a host that died silently) resets nothing and is on nobody's next hop: no peer's probe finds
it, and the commit waits for its Done until its record expires, three heartbeats and a grace after its last store
(16-18 s at a 3-s heartbeat with 20 peers, against ~11-s iterations). The other holders' reports say when it is
late: once half of the holders reported, one that has not after `LATE_SHARE` of the time the median took, and at
least `LATE_FLOOR` seconds past the median, is asked over gossip (`Suspicions.ping`), and the lateness is the
scheduler's own report against it: unanswered, the ping corroborates it and the holder is declared gone, as a
peer's report and an unanswered ping do (`UnreachableReports`). A live holder that is merely slow answers the
ping and is waited for. Each holder is asked at most once per iteration and epoch.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection

LATE_FLOOR = 2.0
"""Seconds past the median holder's report before a holder that has not reported is late."""
LATE_SHARE = 0.5
"""A holder is late once the time past the median report exceeds this share of the median report's time."""
WITNESS = "the scheduler (its Done is late)"
"""The reporter the lateness counts as, in `UnreachableReports` and the logs."""


class LateHolders:
    """When the iteration in progress began, when its holders reported it, and whom the scheduler asked."""

    def __init__(self) -> None:
        self._began = 0.0
        self._reported: dict[tuple[int, int], dict[str, float]] = {}
        self._asked: set[tuple[int, int, str]] = set()

    def began(self, now: float) -> None:
        """An iteration, or a new epoch of the one in progress, starts now."""
        self._began = now

    def done(self, holder: str, iteration: int, epoch: int, now: float) -> None:
        """`holder`'s report of `iteration` under `epoch` came now (the first one counts)."""
        self._reported.setdefault((iteration, epoch), {}).setdefault(holder, now)

    def committed(self, iteration: int) -> None:
        """Forget `iteration` and those before it."""
        self._reported = {k: v for k, v in self._reported.items() if k[0] > iteration}
        self._asked = {k for k in self._asked if k[0] > iteration}

    def late(self, iteration: int, epoch: int, holders: Collection[str], now: float) -> list[str]:
        """Those of `holders` (the ones `iteration` waits for under `epoch`) that are late and not asked yet; they
        count as asked from now on."""
        reported = self._reported.get((iteration, epoch), {})
        times = sorted(t for h, t in reported.items() if h in holders)
        if not holders or 2 * len(times) < len(holders):
            return []
        median = statistics.median_low(times)
        if now - median < max(LATE_FLOOR, LATE_SHARE * (median - self._began)):
            return []
        late = sorted(h for h in holders if h not in reported and (iteration, epoch, h) not in self._asked)
        self._asked.update((iteration, epoch, h) for h in late)
        return late
