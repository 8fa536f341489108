"""`AliveBeat`: the scheduler's `Alive` on gossip once a heartbeat, from a thread of its own, while its loop works.

The role's loop plans and publishes epochs in line. On a loaded 20-peer host one re-plan held it for 19 s (6.6 s
in the planner, the rest handing stages and shards over and storing the epoch in the DHT), longer than a record
lives: beating from the loop, the scheduler fell silent, every peer took it for dead, and their successors competed
with it (167 changes of scheduler in one 4-minute run). Beating from here, a scheduler busy with a step that ends
stays the scheduler. One whose loop has not come round for `STALLED_AFTER` seconds (a bug, a deadlock) beats no
more, and its successor takes over as from a dead one. A process stopped whole (its host frozen) beats no more
either: this thread stops with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from swarm.control.messages import Alive

logger = logging.getLogger(__name__)

STALLED_AFTER = 60.0
"""Seconds without a turn of the role's loop after which the scheduler no longer beats (the longest step seen, a
20-peer re-plan on a loaded host, took 19 s)."""


class AliveBeat:
    """Beats `beat()` (None: nothing to say now) through `send` every `period` seconds while the loop turns.

    :param stalled_after: seconds without `turned` after which it stops beating, until the next `turned`
    """

    def __init__(self, period: float, beat: Callable[[], Alive | None], send: Callable[[Alive], None], *,
                 stalled_after: float = STALLED_AFTER) -> None:
        if not period > 0 or not stalled_after > 0:
            raise ValueError(f"the period ({period}) and the stall limit ({stalled_after}) must be above 0")
        self.period, self.stalled_after = period, stalled_after
        self._beat, self._send = beat, send
        self._turned = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AliveBeat:
        """Start beating (once; again after `stop`, no)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="skippipe-alive-beat")
            self._thread.start()
        return self

    def turned(self) -> None:
        """The role's loop came round (any thread)."""
        self._turned = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            if time.monotonic() - self._turned <= self.stalled_after:
                message = self._beat()
                if message is not None:
                    try:
                        self._send(message)
                    except Exception as e:  # a gossip hiccup: the next beat tries again
                        logger.warning("could not gossip the scheduler's beat: %s: %s", type(e).__name__, e)
            if self._stop.wait(self.period):
                return
