"""The gossip sidecar verifies each peer's signed peer record once per envelope, not on every pubsub message, and
serializes its own once, not for every RPC it sends.

Runs in a subprocess: py-libp2p cannot be imported next to hivemind (the other swarm tests' process).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = r"""
import json
from libp2p.pubsub.pb import rpc_pb2
from swarm.control.signed_record_cache import SignedRecordCache

calls = []
def check(msg, host, peer_id):
    calls.append((str(peer_id), msg.senderRecord))
    return msg.senderRecord != b"forged"

def rpc(record=None):
    m = rpc_pb2.RPC()
    if record is not None:
        m.senderRecord = record
    return m

cache = SignedRecordCache(check, max_entries=2, reverify_after=3600)
out = {}
out["plain"] = cache(rpc(), None, "A")  # no record attached: nothing to check
out["first"] = [cache(rpc(b"env-A"), None, "A") for _ in range(5)]
out["calls_after_repeats"] = len(calls)
out["other_peer_same_bytes"] = cache(rpc(b"env-A"), None, "B")
out["forged"] = [cache(rpc(b"forged"), None, "A") for _ in range(2)]
out["calls_after_forged"] = len(calls)
cache(rpc(b"env-C"), None, "C")  # evicts the oldest entry (A's): at most 2 kept
cache(rpc(b"env-A"), None, "A")
out["calls_after_eviction"] = len(calls)
stale = SignedRecordCache(check, reverify_after=0.0)
stale(rpc(b"env-A"), None, "A"); stale(rpc(b"env-A"), None, "A")
out["calls_with_immediate_reverify"] = len(calls)
print(json.dumps(out))
"""


def test_a_record_is_verified_once_per_peer_and_envelope_and_failures_are_never_cached():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=50, check=True)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["plain"] is True
    assert out["first"] == [True] * 5 and out["calls_after_repeats"] == 1  # four repeats cost nothing
    assert out["other_peer_same_bytes"] is True  # checked again: the pair is (peer, bytes)
    assert out["forged"] == [False, False] and out["calls_after_forged"] == 4  # a failure is checked every time
    assert out["calls_after_eviction"] == 6  # A's entry was evicted, so A was checked again
    assert out["calls_with_immediate_reverify"] == 8


OWN_RECORD = r"""
import json
from swarm.control.signed_record_cache import OwnRecordCache

class Store:
    record = None
    def get_local_record(self):
        return self.record

class Host:
    def __init__(self):
        self.store = Store()
    def get_peerstore(self):
        return self.store

issued = []
def issue(host):  # py-libp2p's env_to_send_in_RPC: a new envelope when there is none or the addresses changed
    created = host.store.record is None or host.readdress
    if created:
        host.store.record = object()
        host.readdress = False
    issued.append(created)
    return f"env-{id(host.store.record)}".encode(), created

host = Host(); host.readdress = False
cache = OwnRecordCache(issue, recheck_after=3600)
out = {}
first = [cache(host) for _ in range(4)]
out["same_bytes"] = len({b for b, _ in first}) == 1
out["created"] = [c for _, c in first]
out["issued_after_four"] = len(issued)
host.store.record = object()  # something else re-issued the host's record: the cache notices at once
out["new_bytes_after_reissue"] = cache(host)[0] != first[0][0]
out["issued_after_reissue"] = len(issued)
eager = OwnRecordCache(issue, recheck_after=0.0)
eager(host); host.readdress = True; b2, created = eager(host)
out["recheck_sees_new_addresses"] = created
print(json.dumps(out))
"""


def test_the_hosts_own_record_is_serialized_once_and_again_when_it_changes():
    result = subprocess.run([sys.executable, "-c", OWN_RECORD], capture_output=True, text=True, timeout=60,
                            check=True)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["same_bytes"] and out["created"] == [True, False, False, False]
    assert out["issued_after_four"] == 1  # three RPCs reused the bytes
    assert out["new_bytes_after_reissue"] and out["issued_after_reissue"] == 2
    assert out["recheck_sees_new_addresses"] is True
