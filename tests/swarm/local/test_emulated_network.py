"""Network emulation: hosts in namespaces whose links the kernel shapes to a profile's bandwidth, torn down
without leftovers; latency files for the transport are checked like any untrusted input."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from swarm.local.emulated_network import EmulatedNetwork, LatencyFile, read_latency_file, unavailable_reason
from swarm.peer.options import PeerOptions

pytestmark = pytest.mark.timeout(120)

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5301)); s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
while c.recv(1 << 20):
    pass
c.sendall(b"k")
"""
CLIENT = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5301)); data = b"x" * (1 << 20); n = int(sys.argv[2])
start = time.perf_counter()
for _ in range(n):
    s.sendall(data)
s.shutdown(socket.SHUT_WR); s.recv(1)
print(n * (1 << 20) / (time.perf_counter() - start))
"""


def goodput(net: EmulatedNetwork, src: int, dst: int, megabytes: int) -> float:
    server = subprocess.Popen([*net.exec_prefix(dst), sys.executable, "-c", SERVER, net.host(dst)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        out = subprocess.run([*net.exec_prefix(src), sys.executable, "-c", CLIENT, net.host(dst), str(megabytes)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return float(out)
    finally:
        server.kill()
        server.wait()


def interfaces() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout + \
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_links_are_shaped_per_direction_and_everything_is_removed():
    mb = 1 << 20
    bandwidth = np.array([[0, 4 * mb], [40 * mb, 0]], dtype=float)
    net = EmulatedNetwork(np.zeros((2, 2)), bandwidth, tag="t" + str(int(time.time()) % 10000))
    with net:
        assert net.namespace(0) in interfaces()
        slow, fast = goodput(net, 0, 1, 12), goodput(net, 1, 0, 60)
    assert 0.7 * 4 * mb < slow < 1.2 * 4 * mb
    assert fast > 3 * slow
    left = interfaces()
    assert net.namespace(0) not in left and net.bridge not in left


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_a_link_reshaped_mid_run_takes_its_new_bandwidth_and_only_that_link():
    mb = 1 << 20
    net = EmulatedNetwork(np.zeros((2, 2)), np.full((2, 2), 40.0 * mb), tag="r" + str(int(time.time()) % 10000))
    with pytest.raises(RuntimeError, match="not started"):
        net.set_bandwidth(0, 1, 4 * mb)
    with net:
        before = goodput(net, 0, 1, 40)
        net.set_bandwidth(0, 1, 4 * mb)
        after, other = goodput(net, 0, 1, 8), goodput(net, 1, 0, 40)
        for src, dst, rate in ((0, 0, 4 * mb), (0, 2, 4 * mb), (0, 1, 999), (0, 1, float("nan"))):
            with pytest.raises(ValueError):
                net.set_bandwidth(src, dst, rate)
    assert before > 25 * mb
    assert 0.7 * 4 * mb < after < 1.2 * 4 * mb
    assert other > 25 * mb  # the way back keeps its class
    assert net.bandwidth[0, 1] == 4 * mb


def test_latency_files_round_trip_and_hostile_ones_are_refused(tmp_path):
    latency = np.array([[0, 0.05, 0.2], [0.05, 0, 0.1], [0.2, 0.1, 0]])
    net = EmulatedNetwork(latency, np.full((3, 3), 1e6))
    path = net.write_latency_file(2, ["A", "B", "C"], tmp_path / "lat.json")
    assert read_latency_file(path) == {"A": 0.2, "B": 0.1}
    for content, match in [("not json", "cannot read"), ("[]", "must hold"), ('{"latency_s": {"A": -1}}', "0-10"),
                           ('{"latency_s": {"A": 1e9}}', "0-10"), ('{"latency_s": {"A": "slow"}}', "0-10"),
                           ('{"latency_s": {"": 0.1}}', "bad peer id")]:
        (tmp_path / "bad.json").write_text(content)
        with pytest.raises(ValueError, match=match):
            read_latency_file(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="latencies"):
        EmulatedNetwork(np.full((2, 2), 20.0), np.full((2, 2), 1e6))
    with pytest.raises(ValueError, match="bandwidths"):
        EmulatedNetwork(np.zeros((2, 2)), np.zeros((2, 2)))
    json.loads(path.read_text())


def test_a_latency_file_rewritten_mid_run_is_read_again_and_a_bad_rewrite_keeps_the_table_in_force(tmp_path, caplog):
    path = tmp_path / "lat.json"
    path.write_text(json.dumps({"latency_s": {"A": 0.0, "B": 0.01}}))
    table, lazy = LatencyFile(path, look_every=0.0), LatencyFile(path, look_every=3600.0)
    assert dict(table) == {"A": 0.0, "B": 0.01} and table.get("C", 0.0) == 0.0
    path.write_text(json.dumps({"latency_s": {"A": 1.5, "B": 0.01}}))  # the link to A slowed
    assert table.get("A") == 1.5 and len(table) == 2
    assert lazy.get("A") == 0.0  # it looks at the file once an hour
    path.write_text('{"latency_s": {"A": -1}}')
    assert table.get("A") == 1.5 and "the latencies in force are kept" in caplog.text
    with pytest.raises(ValueError, match="0-10"):
        LatencyFile(path)
    # what a peer's transport waits: looked up per message, so a rewrite takes effect from the next one
    delay = PeerOptions(initial_peers=(), identity_path="", run_id="r", link_latency=table).link_delay()
    assert delay("A") == 1.5 and delay("C") == 0.0
    assert PeerOptions(initial_peers=(), identity_path="", run_id="r").link_delay() is None


def test_each_tag_gets_its_own_subnet_and_bad_tags_are_refused():
    a, b = (EmulatedNetwork(np.zeros((2, 2)), np.full((2, 2), 1e6), tag=t) for t in ("alpha", "beta"))
    assert a.gateway != b.gateway and a.host(0) != b.host(0)
    for bad in ("a-b", "much-too-long", "x y"):
        with pytest.raises(ValueError, match="tag"):
            EmulatedNetwork(np.zeros((2, 2)), np.full((2, 2), 1e6), tag=bad)
