"""`Node` starts a real DHT (with its p2pd and a reaper), a gossip sidecar on the run's topics and a heartbeat;
a second node finds the first's record and reaches it on gossip; `stop` takes every helper down (the module's
leak check fails on any process or socket left)."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time

import pytest

from swarm.control.messages import Join, publish, received
from swarm.control.node import Node
from swarm.events import EVENT_ATTR
from swarm.net.identity import ensure_identity
from swarm.wire import PeerRecord, PeerState

pytestmark = pytest.mark.timeout(120)


def record(node: Node) -> PeerRecord:
    return PeerRecord(peer_id=node.peer_id, stage=-1, seconds_per_layer=1.0, memory_slots=1, state=PeerState.ONLINE,
                      control_addrs=tuple(node.gossip_info.maddrs))


def records_of(node: Node) -> dict:
    return node.records.fetch_peers()


def test_two_nodes_find_each_other_and_stop_cleanly(tmp_path):
    inbox: queue.Queue = queue.Queue()
    keys = [str(tmp_path / f"{name}.key") for name in ("first", "second")]
    for key in keys:
        ensure_identity(key)
    first = Node(keys[0], "nodes", on_message=inbox.put)
    second = Node(keys[1], "nodes")
    try:
        first.start_dht()
        first.start_gossip()
        first.start_heartbeat(lambda: record(first), period=1.0)
        records = second.start_dht(first.visible_maddrs())
        second.start_gossip(bootstrap=first.gossip_info.maddrs)
        end = time.monotonic() + 30
        while first.peer_id not in (peers := records.fetch_peers()) and time.monotonic() < end:
            time.sleep(0.5)
        assert peers[first.peer_id].control_addrs == tuple(first.gossip_info.maddrs)
        second.gossip.wait_for_mesh("skippipe/nodes/membership", 1, timeout=30)
        publish(second.gossip, "nodes", Join(peer=second.peer_id))
        msg = inbox.get(timeout=30)
        assert msg.sender == second.peer_id and received(msg, "nodes") == Join(peer=second.peer_id)
        assert first.reaper is second.reaper  # one per process: a reaper's sweep takes all of its process's children
        second.stop()
        assert first.dht.is_alive() and first.peer_id in records_of(first)  # the first node is untouched
    finally:
        second.stop()
        first.stop()
        first.stop()  # idempotent
    assert first.dht is None and first.reaper is None and first.gossip is None


NODE_IN_A_FRESH_PROCESS = """
import json, sys, psutil
from swarm.control.node import Node
from swarm.net.identity import ensure_identity
ensure_identity(sys.argv[1])
node = Node(sys.argv[1], "fresh")
try:
    node.start_dht()
    node.dht.store("k", b"v", expiration_time=2e9)  # a DHT call: hivemind shares its future's state with the DHT
    found = node.dht.get("k")
    names = [p.name() for p in psutil.Process().children(recursive=True)]
finally:
    node.stop()
print(json.dumps({"found": found is not None and found.value == b"v", "children": names}))
"""


def test_a_node_starts_no_shared_memory_manager(tmp_path):
    """hivemind's DHT calls share memory with its process; a node does it without a `torch_shm_manager` (~60 MiB)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NODE_IN_A_FRESH_PROCESS, str(tmp_path / "fresh.key")],
                         capture_output=True, text=True, timeout=90, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["found"]
    assert "p2pd" in result["children"] and "torch_shm_manager" not in result["children"]


def beats_and_is_found(node: Node, records, timeout: float = 30.0) -> bool:
    """Start `node`'s heartbeat; whether its record shows up in `records` within `timeout` seconds."""
    node.start_heartbeat(lambda: PeerRecord(peer_id=node.peer_id, stage=-1, seconds_per_layer=1.0, memory_slots=1,
                                            state=PeerState.ONLINE), period=1.0)
    end = time.monotonic() + timeout
    while node.peer_id not in records.fetch_peers():
        if time.monotonic() >= end:
            return False
        time.sleep(0.5)
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_node_whose_bootstrap_peer_is_not_up_yet_tries_again_and_joins(tmp_path, caplog):
    """The second node's first daemon reaches no bootstrap peer and exits; the node starts another once the first
    node is up, and the two find each other."""
    keys = [str(tmp_path / f"{name}.key") for name in ("first", "second")]
    ids = [ensure_identity(key) for key in keys]
    port = free_port()
    first = Node(keys[0], "late", port=port)
    second = Node(keys[1], "late")
    started = threading.Timer(2.0, first.start_dht)
    try:
        started.start()  # after the second node's first try has failed (the daemon gives up in ~4 s)
        with caplog.at_level(logging.WARNING, logger="swarm.control.node"):
            records = second.start_dht([f"/ip4/127.0.0.1/tcp/{port}/p2p/{ids[0]}"])
        started.join()
        events = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
        assert [e["attempt"] for e in events if e["event"] == "dht_start_failed"] == [1]
        assert beats_and_is_found(first, records), "the second node never found the first"
    finally:
        started.cancel()
        second.stop()
        first.stop()



def test_a_dht_process_not_ready_in_time_is_killed_and_started_again(tmp_path, caplog):
    """A DHT process that hangs before it is ready (here: it cannot send its readiness, because this process holds
    the lock hivemind sends it under, as a killed peer's forked sibling once did) would keep a joiner waiting for
    ever. It is killed with its daemon, and a second one starts once the lock is free."""
    from hivemind.utils.mpfuture import MPFuture

    key = str(tmp_path / "node.key")
    ensure_identity(key)
    node = Node(key, "hung")
    lock = MPFuture._update_lock
    lock.acquire()
    released = threading.Timer(6.0, lock.release)  # after the first try's 4 s, before the second try starts
    try:
        released.start()
        with caplog.at_level(logging.INFO, logger="swarm.control.node"):
            records = node.start_dht(ready_timeout=4.0)
        failures = [getattr(r, EVENT_ATTR) for r in caplog.records
                    if getattr(r, EVENT_ATTR, {}).get("event") == "dht_start_failed"]
        assert [f["attempt"] for f in failures] == [1]
        assert "not ready within 4 s" in failures[0]["error"] and "its threads wait in" in failures[0]["error"]
        assert any("DHT up in" in r.getMessage() and "(try 2)" in r.getMessage() for r in caplog.records)
        assert beats_and_is_found(node, records), "the second DHT never served the node's own record"
    finally:
        released.join()
        node.stop()
