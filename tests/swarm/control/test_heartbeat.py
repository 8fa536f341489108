"""A heartbeat keeps its cadence when stores are slow or fail, so a loaded DHT does not age a live peer's record
past what the scheduler takes for overdue."""

from __future__ import annotations

import threading
import time

from swarm.control.records import Heartbeat
from swarm.wire import PeerRecord


class TimedStores:
    """Records where every store takes `seconds` and every `fail_every`-th one fails; notes when each started."""

    def __init__(self, seconds: float, fail_every: int = 0) -> None:
        self.seconds, self.fail_every = seconds, fail_every
        self.started: list[float] = []
        self.enough = threading.Event()

    def publish_peer(self, record: PeerRecord, *, ttl: float, timeout: float) -> bool:
        self.started.append(time.monotonic())
        if len(self.started) >= 6:
            self.enough.set()
        time.sleep(self.seconds)
        if self.fail_every and len(self.started) % self.fail_every == 0:
            raise TimeoutError("the store timed out")
        return True


def beat(stores: TimedStores, period: float) -> Heartbeat:
    heartbeat = Heartbeat(stores, lambda: None, period=period, ttl=10 * period)
    heartbeat.start()
    assert stores.enough.wait(10 * period)
    heartbeat.stop(leave=False)
    return heartbeat


def test_a_slow_store_does_not_stretch_the_period():
    stores = TimedStores(seconds=0.3)
    heartbeat = beat(stores, period=0.5)
    gaps = [b - a for a, b in zip(stores.started, stores.started[1:])]
    assert max(gaps) < 0.65, gaps  # a beat every period, not every period and a store
    assert heartbeat.beats >= 5


def test_a_failed_store_is_retried_at_the_next_beat_and_beating_goes_on():
    stores = TimedStores(seconds=0.05, fail_every=2)
    heartbeat = beat(stores, period=0.2)
    gaps = [b - a for a, b in zip(stores.started, stores.started[1:])]
    assert max(gaps) < 0.35, gaps
    assert 2 <= heartbeat.beats < len(stores.started)
