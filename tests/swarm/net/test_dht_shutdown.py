"""stop_dht removes the socket file a p2pd that died uncleanly left behind, and only that one."""

from __future__ import annotations

import os
import signal
import time

import hivemind
import psutil
import pytest

from swarm.net.dht_shutdown import daemon_socket_path, is_listened_on, stop_dht

pytestmark = pytest.mark.timeout(60)


def test_clean_shutdown_leaves_no_socket():
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    path = daemon_socket_path(dht)
    assert path is not None and is_listened_on(path)
    stop_dht(dht)
    assert not dht.is_alive() and not os.path.exists(path)


def test_socket_of_a_killed_daemon_is_removed_and_others_are_kept(tmp_path):
    bystander = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    try:
        path, other = daemon_socket_path(dht), daemon_socket_path(bystander)
        (daemon,) = [p for p in psutil.Process(dht.pid).children() if p.name() == "p2pd"]
        os.kill(daemon.pid, signal.SIGKILL)  # dies without unlinking its socket, as under a hard terminate
        daemon.wait(10)
        assert os.path.exists(path) and not is_listened_on(path)
        stop_dht(dht)
        assert not dht.is_alive() and not os.path.exists(path)
        assert is_listened_on(other)
    finally:
        stop_dht(dht)
        stop_dht(bystander)


async def _wedge(dht, node):  # noqa: ARG001 - runs in the DHT process and blocks its loop, as a stuck request does
    time.sleep(120)


def test_a_wedged_dht_deaf_to_sigterm_is_killed_with_its_daemon_and_its_sockets_removed():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the fork: hivemind's terminate is ignored
    try:
        dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    path = daemon_socket_path(dht)
    (daemon,) = [p for p in psutil.Process(dht.pid).children() if p.name() == "p2pd"]
    dht.run_coroutine(_wedge, return_future=True)
    time.sleep(0.5)  # the loop is blocked now: shutdown cannot be heard, terminate is ignored
    stop_dht(dht)
    assert not dht.is_alive() and not daemon.is_running()
    assert path is not None and not os.path.exists(path)
    stop_dht(dht)  # again: nothing left to do, and no error
