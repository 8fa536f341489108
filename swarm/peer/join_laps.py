"""`JoinLaps`: how long each step of a peer's join took, from its process's start to its first placement.

A joiner on a loaded host took a minute or more from its start to its first iteration, and its log said when it was
admitted and placed but not what filled the time between (the DHT, its data, its speed measurement, a records read,
its gossip links, its probes). Each step's seconds go into the `joined` and `placed` events, so that a benchmark can
say which step a joiner waited on, and a user reading the log line can too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

SHOWN_LAPS = 4
"""How many of the longest steps the log line names."""


def process_age() -> float:
    """Seconds since this process started (a peer forked from a warm starter: since its fork); 0.0 if unknown."""
    try:
        return max(0.0, time.time() - psutil.Process().create_time())
    except psutil.Error:
        return 0.0


class JoinLaps:
    """Named laps of one join: `lap(name)` adds the time since the previous lap (or the start) to `name`'s total.

    The first lap, "start", is the process's age when the laps begin (imports, identity, the warm starter's fork)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, start: float | None = None) -> None:
        self._clock = clock
        self._last = clock()
        self.laps: dict[str, float] = {"start": round(process_age() if start is None else start, 3)}

    def lap(self, name: str) -> float:
        """Close the lap `name` now; the seconds it took (a name used twice adds up)."""
        now = self._clock()
        took = now - self._last
        self._last = now
        self.laps[name] = round(self.laps.get(name, 0.0) + took, 3)
        return took

    def finish(self, name: str) -> dict[str, object]:
        """Close the lap `name`; the fields of an event that ends here: seconds since the start, and each lap's."""
        self.lap(name)
        return {"seconds": self.total, "laps": dict(self.laps)}

    @property
    def total(self) -> float:
        return round(sum(self.laps.values()), 3)

    def longest(self, n: int = SHOWN_LAPS) -> str:
        """The `n` longest laps, for a log line: "data 3.1 s, speed 2.0 s, ..."."""
        top = sorted(self.laps.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in top)
