"""A pubsub message's signature is verified once, its sender's key imported once; forgeries are never remembered.

Runs in a subprocess: py-libp2p cannot be imported next to hivemind (the other swarm tests' process). Messages are
signed with a real RSA key the way py-libp2p's Pubsub signs what it publishes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = r"""
import json
from libp2p.crypto.rsa import create_new_key_pair
from libp2p.crypto.serialization import deserialize_public_key
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX, signature_validator
from swarm.control.message_signatures import MessageSignatures

alice, mallory = create_new_key_pair(1024), create_new_key_pair(1024)

def signed(pair, data, seqno=1, topic="t"):
    msg = rpc_pb2.Message(data=data, topicIDs=[topic], from_id=ID.from_pubkey(pair.public_key).to_bytes(),
                          seqno=seqno.to_bytes(8, "big"))
    signature = pair.private_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
    msg.key, msg.signature = pair.public_key.serialize(), signature
    return msg

checks, imports = [], []
def check(msg):
    checks.append(1)
    return signature_validator(msg)
def import_key(data):
    imports.append(1)
    return deserialize_public_key(data)

sigs = MessageSignatures(check, import_key, max_messages=2)
import libp2p.pubsub.validators as v
v.deserialize_public_key = sigs.key  # what install() does for the key import
out = {}
m1 = signed(alice, b"hello")
out["first"] = [sigs(m1) for _ in range(3)]
out["checks_after_repeats"] = len(checks)
copy = rpc_pb2.Message(); copy.ParseFromString(m1.SerializeToString())
out["copy"] = sigs(copy)  # the same message forwarded by another mesh peer
out["checks_after_copy"] = len(checks)
m2 = signed(alice, b"world", seqno=2)
out["second_message"] = sigs(m2)
out["imports_for_two_messages"] = len(imports)
tampered = rpc_pb2.Message(); tampered.CopyFrom(m1); tampered.data = b"HELLO"
out["tampered"] = [sigs(tampered) for _ in range(2)]
moved = rpc_pb2.Message(); moved.CopyFrom(m1); moved.topicIDs[0] = "other"
out["other_topic"] = sigs(moved)
stolen = signed(mallory, b"hello"); stolen.from_id = m1.from_id  # mallory's key claiming alice's id
out["stolen_identity"] = sigs(stolen)
out["checks_after_forgeries"] = len(checks)
sigs(signed(alice, b"a", seqno=3)); sigs(signed(alice, b"b", seqno=4))  # two more: m1 is forgotten
before = len(checks); sigs(m1)
out["rechecked_after_eviction"] = len(checks) - before
try:
    sigs.key(b"garbage")
    out["garbage_key"] = "accepted"
except Exception as e:
    out["garbage_key"] = type(e).__name__
print(json.dumps(out))
"""


def test_a_message_is_verified_once_and_a_forgery_every_time():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=100, check=True)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["first"] == [True] * 3 and out["checks_after_repeats"] == 1  # two repeats cost nothing
    assert out["copy"] is True and out["checks_after_copy"] == 1
    assert out["second_message"] is True and out["imports_for_two_messages"] == 1  # alice's key imported once
    assert out["tampered"] == [False, False]  # another message than the one verified: checked, and fails
    assert out["other_topic"] is False and out["stolen_identity"] is False
    assert out["checks_after_forgeries"] == 6  # each forgery was checked, none remembered
    assert out["rechecked_after_eviction"] == 1
    assert out["garbage_key"] != "accepted"

