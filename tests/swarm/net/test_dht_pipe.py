"""hivemind's DHT process survives large commands once its command pipe is blocking (it died of a 16 KiB one)."""

from __future__ import annotations

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
