"""The NAT topology itself: a home host reaches the public side (and its own home), the public side cannot open
a connection to a home host, one home cannot reach another; everything is removed afterwards."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from swarm.local.nat_network import NatNetwork, unavailable_reason

pytestmark = pytest.mark.timeout(60)

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5311)); s.listen(8)
print("ready", flush=True)
while True:
    c, a = s.accept(); c.sendall(a[0].encode()); c.close()
"""
CLIENT = """
import socket, sys
try:
    print(socket.create_connection((sys.argv[1], 5311), timeout=1.5).recv(64).decode())
except OSError as e:
    print("no route")
"""


def seen_as(src: list[str], dst: list[str], address: str) -> str:
    """What the server at `address` (run with prefix `dst`) sees a client from `src` as, or 'no route'."""
    server = subprocess.Popen([*dst, sys.executable, "-c", SERVER, address], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        return subprocess.run([*src, sys.executable, "-c", CLIENT, address], capture_output=True, text=True,
                              timeout=20).stdout.strip()
    finally:
        server.kill()
        server.wait()


def test_homes_reach_out_nobody_reaches_in_and_nothing_is_left():
    net = NatNetwork([None, 0, 1, 0], tag="n" + str(int(time.time()) % 10000))
    with pytest.raises(ValueError, match="homes must be"):
        NatNetwork([None, -1])
    if unavailable_reason() is not None:
        pytest.skip(str(unavailable_reason()))
    with net:
        public, home_a, home_b, home_a2 = (net.exec_prefix(i) for i in range(4))
        assert seen_as(home_a, public, net.host(0)) == net.router_address(0)  # masqueraded
        assert seen_as(home_a, [], net.gateway) == net.router_address(0)  # the coordinator's side
        assert seen_as(home_a, home_a2, net.host(3)) == net.host(1)  # same home: direct
        assert seen_as(public, home_a, net.host(1)) == "no route"
        assert seen_as([], home_a, net.host(1)) == "no route"
        assert seen_as(home_b, home_a, net.host(1)) == "no route"
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.namespace(0) not in left and net.router_namespace(0) not in left
