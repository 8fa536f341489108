"""`AwayWatch`: whether this process was away, not run at all for a while (its host frozen, SIGSTOP, a suspended
machine), as opposed to busy with a slow step of its own (a plan, a DHT store that times out).

The scheduler role's loop cannot tell the two apart by its own ticks: a first plan waiting on a loaded DHT makes one
tick last 6-9 s. A thread of its own looks at the clock every `period` seconds and sleeps in between, so it keeps
looking while the loop is busy; only when the whole process stops does the gap between two looks grow. A `take`
counts the time since the thread's last look too: thawed, the loop may run before that thread does, and must not act
on a message that came while it was away before it knows.
"""

from __future__ import annotations

import threading
import time

PERIOD = 0.5
"""Seconds between two looks at the clock."""


class AwayWatch:
    """Absences of this process longer than `limit` seconds, as its looks at the clock show them."""

    def __init__(self, limit: float, period: float = PERIOD) -> None:
        if not limit > period > 0:
            raise ValueError(f"the limit ({limit}) must exceed the period ({period}), itself above 0")
        self.limit, self.period = limit, period
        self._gap = 0.0
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AwayWatch:
        """Start looking (once; again after `stop`, no)."""
        if self._thread is None:
            with self._lock:
                self._last = time.monotonic()  # away counts from here
            self._thread = threading.Thread(target=self._run, daemon=True, name="skippipe-away-watch")
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def take(self) -> float:
        """The longest absence over `limit` seen since the last call, in seconds (0: none); this call is a look at
        the clock too (one absence is taken once, by whichever of the thread and the caller looks first)."""
        self._look()
        with self._lock:
            gap, self._gap = self._gap, 0.0
        return gap

    def _look(self) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last > self.limit:
                self._gap = max(self._gap, now - self._last)
            self._last = now

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._look()
