"""The gossip sidecar verifies each peer's signed peer record once per envelope, not on every pubsub message.

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
