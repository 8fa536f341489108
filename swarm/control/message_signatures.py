"""Pubsub message signatures checked once per message, each sender's key imported once (gossip sidecar only:
imports libp2p).

A message that reaches a sidecar is checked twice, by the sidecar (to log why it drops one) and again by
py-libp2p's Pubsub (strict signing), and each check imports the sender's RSA key from DER in pure Python before it
verifies: ~12% of a sidecar's CPU while an 8-peer swarm trained. `MessageSignatures` is py-libp2p's check with two
memories: the digests of messages that passed (a copy of one forwarded by another mesh peer, or the second check
of the same message, is accepted without the work) and the imported keys, by their bytes. A message is remembered
by everything the check reads (sender, sequence number, topics, data, key, signature), so no other message can
pass as one that was verified; a failure is never remembered.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import libp2p.pubsub.pubsub
import libp2p.pubsub.validators
from libp2p.crypto.serialization import deserialize_public_key
from libp2p.pubsub.validators import signature_validator

Check = Callable[[Any], bool]
Import = Callable[[bytes], Any]


class MessageSignatures:
    """A signature check with the contract of py-libp2p's `signature_validator` (True: validly signed by the
    sender), and the key import it uses, both remembered.

    :param check: the check proper (py-libp2p's)
    :param import_key: the key import the check calls, by name, from its module (py-libp2p's)
    :param max_messages: digests of verified messages kept (the oldest are forgotten first)
    :param max_keys: imported keys kept
    """

    def __init__(self, check: Check = signature_validator, import_key: Import = deserialize_public_key, *,
                 max_messages: int = 4096, max_keys: int = 1024) -> None:
        self.check, self.import_key = check, import_key
        self.max_messages, self.max_keys = max_messages, max_keys
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._keys: OrderedDict[bytes, Any] = OrderedDict()
        self.hits = self.misses = 0

    def __call__(self, msg: Any) -> bool:
        digest = self.digest(msg)
        if digest in self._verified:
            self._verified.move_to_end(digest)
            self.hits += 1
            return True
        self.misses += 1
        ok = bool(self.check(msg))
        if ok:
            self._verified[digest] = None
            while len(self._verified) > self.max_messages:
                self._verified.popitem(last=False)
        return ok

    def key(self, data: bytes) -> Any:
        """The public key serialized as `data`, imported once; an import that fails raises, as py-libp2p's does."""
        data = bytes(data)
        found = self._keys.get(data)
        if found is None:
            found = self._keys[data] = self.import_key(data)
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(data)
        return found

    @staticmethod
    def digest(msg: Any) -> bytes:
        """What the check reads of `msg`, hashed; fields are length-prefixed so no two messages share it."""
        h = hashlib.sha256()
        for field in (msg.from_id, msg.seqno, *(t.encode() for t in msg.topicIDs), msg.data, msg.key,
                      msg.signature):
            h.update(len(field).to_bytes(8, "big"))
            h.update(field)
        h.update(len(msg.topicIDs).to_bytes(8, "big"))
        return h.digest()


def install(signatures: MessageSignatures) -> None:
    """Make py-libp2p's Pubsub check signatures through `signatures`, and its check import keys through it."""
    libp2p.pubsub.pubsub.signature_validator = signatures
    libp2p.pubsub.validators.deserialize_public_key = signatures.key
