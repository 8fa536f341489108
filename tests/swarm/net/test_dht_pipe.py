"""hivemind's DHT process survives large commands once its command pipe is blocking (it died of a 16 KiB one) and
this process's threads send one at a time (it died of two sent at once, interleaved)."""

from __future__ import annotations

import os
import threading

import hivemind
import pytest
from hivemind.utils import get_dht_time

from swarm.net.dht_pipe import make_commands_safe
from swarm.net.dht_shutdown import stop_dht

pytestmark = pytest.mark.timeout(120)


def test_large_values_are_stored_and_the_dht_lives_on():
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    try:
        make_commands_safe(dht)
        for size in (16 << 10, 64 << 10, 1 << 20):  # a schedule of 20-40 peers is tens of KiB
            assert dht.store("big", b"x" * size, expiration_time=get_dht_time() + 60, subkey=str(size))
        assert dht.is_alive()
        found = dht.get("big", latest=True)
        assert sorted(len(item.value) for item in found.value.values()) == [16 << 10, 64 << 10, 1 << 20]
    finally:
        stop_dht(dht)


def test_large_commands_sent_by_several_threads_at_once_all_arrive_and_the_dht_lives_on():
    """A peer's heartbeat, records reads and schedule reads run on threads of their own; without one send at a time
    the DHT process died within two rounds of this (an UnpicklingError), and every later call timed out."""
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    failures: list[str] = []

    def send(thread: int) -> None:
        for _ in range(20):
            try:
                stored = dht.store(f"key-{thread}", os.urandom(40 << 10), expiration_time=get_dht_time() + 60,
                                   return_future=True)
                assert stored.result(timeout=30)
                assert dht.get(f"key-{thread}", latest=True, return_future=True).result(timeout=30) is not None
            except Exception as e:
                failures.append(f"{type(e).__name__}: {e}")
                return

    try:
        make_commands_safe(dht)
        threads = [threading.Thread(target=send, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=100)
        assert failures == [] and dht.is_alive()
    finally:
        stop_dht(dht)
