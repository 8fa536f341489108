"""`AdmissionDesk`: the scheduler's side of admission. Which records belong to members, and certificates for
the peers the policy admits.

Each read of the peers' records passes through `sort`: a record carrying a valid certificate (issued by the
coordinator or by this scheduler) is a member's, and is all the scheduler ever plans with; the certificate is
renewed once a third of its life is left, as long as the peer beats. A record without one is a joiner's: if its
proof of the join token (or the allow list, or an open run) admits it, it gets a certificate on gossip
(`Admitted`), which it puts into its record and so becomes a member at its next heartbeat; if not, it is told why
(`Refused`) and never placed. Announcements are repeated at most every `ANNOUNCE_AGAIN` seconds per peer (gossip
may lose one; a flood of joiners cannot make the desk gossip every tick).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from swarm.constants import CERT_LIFETIME
from swarm.control.membership import AdmissionPolicy, MembershipCert, cert_problem
from swarm.control.messages import Admitted, ControlMessage, Refused
from swarm.events import event
from swarm.net.identity import Identity
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

ANNOUNCE_AGAIN = 10.0
"""Seconds before the desk repeats a certificate or a refusal to the same peer."""
MAX_PENDING = 4096
"""Joiners the desk remembers an announcement to (oldest forgotten first)."""


class AdmissionDesk:
    """Admits peers to run `run_id` under `policy`, signing certificates with `identity` (the scheduler's key).

    :param exempt: peers that are members without a certificate (the coordinator's own heartbeat record)
    :param issuers: who else's certificates are valid (the coordinator's, for a successor scheduler)
    :param banned: peers evicted from the run (the scheduler's own set, read live): never members again
    """

    def __init__(self, policy: AdmissionPolicy, identity: Identity, run_id: str, *, exempt: Collection[str] = (),
                 issuers: Collection[str] = (), banned: Collection[str] = frozenset(),
                 lifetime: float = CERT_LIFETIME) -> None:
        self.policy, self.identity, self.run_id, self.lifetime = policy, identity, run_id, lifetime
        self.banned = banned
        self.exempt = frozenset(exempt)
        self.issuers = frozenset(issuers) | {identity.peer_id}
        self._announced: dict[str, float] = {}
        """Peer -> when a certificate or refusal was last gossiped to it (DHT clock)."""

    def sort(self, records: Mapping[str, tuple[PeerRecord, float]], now: float
             ) -> tuple[dict[str, tuple[PeerRecord, float]], list[ControlMessage]]:
        """(the members' records, what to gossip) for one read of the records; `now` is the DHT clock."""
        members, out = {}, []
        for peer, (record, age) in records.items():
            if peer in self.exempt:
                members[peer] = (record, age)
                continue
            if peer in self.banned:
                if self._due(peer, now):
                    out.append(Refused(peer=peer, why="it was evicted from the run"))
                continue
            problem = cert_problem(record.cert, peer=peer, run=self.run_id, issuers=self.issuers, now=now)
            if problem is None:
                members[peer] = (record, age)
                expires = MembershipCert.from_msgpack(record.cert).expires
                if expires - now < self.lifetime / 3 and self._due(peer, now):
                    out.append(self._admit(peer, now))
                continue
            if not self._due(peer, now):
                continue
            refusal = self.policy.refusal(peer, self.run_id, record.admission)
            if refusal is None:
                out.append(self._admit(peer, now))
                logger.info("admitted %s to run %s", peer, self.run_id, extra=event("admitted", peer=peer))
            else:
                logger.warning("refused %s: %s", peer, refusal, extra=event("refused_peer", peer=peer, why=refusal))
                out.append(Refused(peer=peer, why=refusal))
        return members, out

    def answer_join(self, peer: str, proof: bytes, now: float) -> Refused | None:
        """What to gossip to `peer`, who announced itself with `proof` (the gossip layer checked that it is the
        sender): the refusal, when the policy refuses it, so that a joiner whose record the DHT refuses (no proof of
        the token, or a wrong one: `swarm.control.record_writers`) still hears why instead of waiting out its join
        timeout; None when it may be admitted (its record brings it a certificate) or was answered lately."""
        if peer in self.exempt:
            return None
        why = "it was evicted from the run" if peer in self.banned else self.policy.refusal(peer, self.run_id, proof)
        if why is None or not self._due(peer, now):
            return None
        logger.warning("refused %s: %s", peer, why, extra=event("refused_peer", peer=peer, why=why))
        return Refused(peer=peer, why=why)

    def _admit(self, peer: str, now: float) -> Admitted:
        cert = MembershipCert.issue(self.identity, peer, self.run_id, now + self.lifetime)
        return Admitted(peer=peer, cert=cert.to_msgpack())

    def _due(self, peer: str, now: float) -> bool:
        """Whether to announce to `peer` now (and note it)."""
        if now - self._announced.get(peer, -ANNOUNCE_AGAIN) < ANNOUNCE_AGAIN:
            return False
        if len(self._announced) >= MAX_PENDING:
            del self._announced[next(iter(self._announced))]
        self._announced.pop(peer, None)
        self._announced[peer] = now
        return True
