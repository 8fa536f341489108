"""py-libp2p's signed peer records, verified once per peer and marshalled once per host (gossip sidecar only:
imports libp2p).

py-libp2p attaches the sender's signed peer record (an envelope: its addresses, signed with its RSA key) to every
pubsub RPC, and checks it on receipt twice (once in Pubsub, once in GossipSub): a DER key import and an RSA
verification in pure Python per control message. That was ~40% of an idle sidecar's CPU, and a swarm runs one
sidecar per peer. A sender reuses its envelope until its addresses change, so a receiver that has verified those
exact bytes from that peer knows the answer: it is accepted again without the work, and re-checked after
`reverify_after` seconds so that the peerstore's copy (kept for two hours) stays fresh. Bytes never verified,
or from another peer, take the full check.

The sending side has the same waste: for each RPC py-libp2p lists the host's addresses and serializes its envelope
again, its RSA key exported to DER in pure Python (~16% of a sidecar's CPU while a swarm trains). `OwnRecordCache`
keeps the bytes and looks at the addresses at most once a `recheck_after`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import libp2p.identity.identify.identify
import libp2p.pubsub.gossipsub
import libp2p.pubsub.pubsub
from libp2p.peer import peerstore
from libp2p.pubsub import utils as pubsub_utils

Check = Callable[[Any, Any, Any], bool]
Issue = Callable[[Any], tuple[bytes, bool]]


class SignedRecordCache:
    """Remembers (peer, envelope bytes) pairs that passed py-libp2p's signed-record check."""

    def __init__(self, check: Check = pubsub_utils.maybe_consume_signed_record, *, max_entries: int = 1024,
                 reverify_after: float = 600.0) -> None:
        self.check, self.max_entries, self.reverify_after = check, max_entries, reverify_after
        self._verified: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        self.hits = self.misses = 0

    def __call__(self, msg: Any, host: Any, peer_id: Any) -> bool:
        if not msg.HasField("senderRecord"):
            return True
        key = (str(peer_id), bytes(msg.senderRecord))
        now = time.monotonic()
        verified = self._verified.get(key)
        if verified is not None and now - verified < self.reverify_after:
            self.hits += 1
            return True
        self.misses += 1
        ok = self.check(msg, host, peer_id)
        if ok:
            self._verified[key] = now
            self._verified.move_to_end(key)
            while len(self._verified) > self.max_entries:
                self._verified.popitem(last=False)
        return ok


def install(cache: SignedRecordCache) -> None:
    """Make py-libp2p's Pubsub and GossipSub check senders' records through `cache` (they import the check by
    name, so both modules' references are replaced)."""
    libp2p.pubsub.pubsub.maybe_consume_signed_record = cache
    libp2p.pubsub.gossipsub.maybe_consume_signed_record = cache


class OwnRecordCache:
    """The host's own envelope bytes for outgoing RPCs (`env_to_send_in_RPC`), serialized once.

    The bytes are issued by py-libp2p's own function, which re-signs when the host's addresses changed; they are
    reused while the peerstore holds the same envelope, and the addresses are compared again after
    `recheck_after` seconds (a listener added later is announced that much later at most).
    """

    def __init__(self, issue: Issue = peerstore.env_to_send_in_RPC, *, recheck_after: float = 1.0) -> None:
        self.issue, self.recheck_after = issue, recheck_after
        self._envelope: Any = None
        self._bytes = b""
        self._checked = -float("inf")
        self.hits = self.misses = 0

    def __call__(self, host: Any) -> tuple[bytes, bool]:
        now = time.monotonic()
        if self._envelope is not None and now - self._checked < self.recheck_after and \
                host.get_peerstore().get_local_record() is self._envelope:
            self.hits += 1
            return self._bytes, False
        self.misses += 1
        data, created = self.issue(host)
        self._envelope, self._bytes, self._checked = host.get_peerstore().get_local_record(), data, now
        return data, created


def install_own(cache: OwnRecordCache) -> None:
    """Make py-libp2p's Pubsub, GossipSub and Identify take the host's envelope bytes from `cache` (each imports
    `env_to_send_in_RPC` by name)."""
    for module in (libp2p.pubsub.pubsub, libp2p.pubsub.gossipsub, libp2p.identity.identify.identify):
        module.env_to_send_in_RPC = cache
