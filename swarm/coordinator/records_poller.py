"""`RecordsPoller`: the peers' records read off the scheduler's loop.

A DHT read can take seconds: hivemind waits out its RPC timeout on a node that stopped answering (a frozen host, a
cut link), and on a loaded machine a read can time out altogether. Read on the scheduler's own loop, that wait held
up the control messages queued meanwhile (the reports a commit waits for), so a silent death cost the whole swarm
a late commit before anyone had even noticed it. Here a thread reads back to back and keeps only the newest read;
the loop takes it when it looks, and never waits for one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

Records = Mapping[str, tuple[Any, float]]
"""peer -> (its record, seconds since its heartbeat), as `SwarmRecords.fetch_peers_with_age` returns them."""


class RecordsPoller:
    """Calls `read` from a background thread, at most once every `period` seconds, and keeps the newest result.

    `take` hands each read over once, its ages advanced by the time since it was read, so that a read taken late
    never makes a silent peer look fresher than it is. A read that raises is logged and counted (`failures`), and
    the next one is tried: no read is not an empty swarm, so nothing is handed over for it.
    """

    def __init__(self, read: Callable[[], Records], period: float = 0.5) -> None:
        self._read, self.period = read, period
        self._lock = threading.Lock()
        self._newest: tuple[Records, float] | None = None
        self.reads = 0
        """Reads completed (each one handed over by `take`, or replaced by a newer one before it was taken)."""
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RecordsPoller:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="skippipe-records-poller", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stop reading (a read still under way is left to finish in its daemon thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def take(self) -> dict[str, tuple[Any, float]] | None:
        """The newest read not handed over yet (ages as of now), or None when none came since the last take."""
        with self._lock:
            newest, self._newest = self._newest, None
        if newest is None:
            return None
        records, at = newest
        late = time.monotonic() - at
        return {peer: (record, age + late) for peer, (record, age) in records.items()}

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                records = self._read()
            except Exception as e:  # a timeout, a daemon hiccup: the next read tries again
                if self._stop.is_set():  # the DHT is going down with its owner
                    return
                self.failures += 1
                logger.warning("could not read the peers' records: %s: %s", type(e).__name__, e)
            else:
                with self._lock:
                    self._newest = (records, time.monotonic())
                    self.reads += 1
            self._stop.wait(max(0.0, self.period - (time.monotonic() - began)))
