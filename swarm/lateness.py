"""When someone awaited is late against the others: one rule for the stage averaging's members and the scheduler's
data holders.

Once at least as many have come as are still awaited (half of them: a lone fast one says nothing about the rest),
those awaited are late when the time past the median arrival exceeds `LATE_FLOOR` seconds or `LATE_SHARE` of the
median's own time, whichever is more. A frozen peer resets nothing, and without this it is waited for until its
record expires; what the caller does with a late one (probe it, commit without it) is its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

LATE_FLOOR = 3.0
"""Seconds past the median arrival before one awaited is late (a live peer on a loaded 2-core machine comes well
within it: in the nine 20-peer runs without churn of 2026-12-06, a data holder came that late in 1 iteration of 139,
the first of a run, by 0.4 s)."""
LATE_SHARE = 0.5
"""...or this share of the median's own time into the wait, whichever is more."""


def overdue(arrivals: Sequence[float], awaited: int, elapsed: float, patience: float = 1.0) -> float | None:
    """How far past the median of `arrivals` (seconds into the wait) the `awaited` are, `elapsed` seconds into it,
    once they are late by `patience` x the margin; None before, or while fewer have come than are awaited."""
    if not awaited or len(arrivals) < awaited:
        return None
    median = statistics.median_low(arrivals)
    behind = elapsed - median
    return behind if behind > patience * max(LATE_FLOOR, LATE_SHARE * median) else None
