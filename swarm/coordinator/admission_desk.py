"""`AdmissionDesk`: the scheduler's side of admission. Which records belong to members, and certificates for
the peers the policy admits.

Each read of the peers' records passes through `sort`: a record carrying a valid certificate (issued by the
coordinator or by this scheduler) is a member's, and is all the scheduler ever plans with; the certificate is
renewed once a third of its life is left, as long as the peer beats. A record without one is a joiner's: if its
proof of the join token (or the allow list, or an open run) admits it, it gets a certificate on gossip
(`Admitted`), which it puts into its record and so becomes a member at its next heartbeat; if not, it is told why
(`Refused`) and never placed. Announcements are repeated at most every `ANNOUNCE_AGAIN` seconds per peer (gossip
may lose one; a flood of joiners cannot make the desk gossip every tick).

A joiner whose record the DHT refuses (no proof of the token, a wrong one: `swarm.control.record_writers`) is told
why from its `Join` instead (`answer_join`). Identities cost strangers nothing, so those answers are few: only to
a fresh Join (not one replayed later), never to a peer that holds a valid certificate, and at most
`JOIN_REFUSAL_BURST` at once, then `JOIN_REFUSALS_PER_SECOND`; past that, the joiner waits out its join timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from swarm.constants import CERT_LIFETIME
from swarm.control.membership import AdmissionPolicy, MembershipCert, cert_problem
from swarm.control.messages import Admitted, ControlMessage, Join, Refused
from swarm.events import event
from swarm.net.identity import Identity
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

ANNOUNCE_AGAIN = 10.0
"""Seconds before the desk repeats a certificate or a refusal to the same peer."""
MAX_PENDING = 4096
"""Joiners the desk remembers an announcement to (oldest forgotten first)."""
JOIN_FRESH = 30.0
"""Seconds a Join is answered after it was sent (a joiner repeats its Join every few seconds while it waits)."""
JOIN_CLOCK_SLACK = 30.0
"""Seconds a Join's sending time may be ahead of the desk's clock."""
JOIN_REFUSALS_PER_SECOND = 1.0
JOIN_REFUSAL_BURST = 10.0
"""Refusals `answer_join` gossips: this many at once, then at that rate."""


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
        self._certified: dict[str, float] = {}
        """Peer -> when the newest certificate it was seen with or given expires (DHT clock)."""
        self._join_budget, self._budget_at = JOIN_REFUSAL_BURST, float("-inf")

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
                    out.append(Refused(peer=peer, why="it was evicted from the run", evicted=True))
                continue
            problem = cert_problem(record.cert, peer=peer, run=self.run_id, issuers=self.issuers, now=now)
            if problem is None:
                members[peer] = (record, age)
                expires = MembershipCert.from_msgpack(record.cert).expires
                self._note_certified(peer, expires)
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

    def answer_join(self, join: Join, now: float) -> Refused | None:
        """What to gossip to the sender of `join` (the caller checked that it is `join.peer`): the refusal, when the
        policy refuses its proof, so that a joiner whose record the DHT refuses still hears why instead of waiting
        out its join timeout; None when it may be admitted (its record brings it a certificate), holds a valid
        certificate, was answered lately, or the Join is stale or over the refusals' budget (see the module)."""
        peer = join.peer
        if peer in self.exempt or peer in self.banned or self._certified.get(peer, float("-inf")) > now:
            return None  # a banned peer hears it from `sort`, while its record lives
        if not now - JOIN_FRESH <= join.sent <= now + JOIN_CLOCK_SLACK:
            logger.debug("ignored a stale join of %s (sent %.0f s ago)", peer, now - join.sent)
            return None
        why = self.policy.refusal(peer, self.run_id, join.admission)
        if why is None or now - self._announced.get(peer, float("-inf")) < ANNOUNCE_AGAIN:
            return None
        self._join_budget = min(JOIN_REFUSAL_BURST,
                                self._join_budget + (now - self._budget_at) * JOIN_REFUSALS_PER_SECOND)
        self._budget_at = now
        if self._join_budget < 1.0:
            logger.debug("refusals over budget: %s not told why", peer)
            return None
        self._join_budget -= 1.0
        self._due(peer, now)
        logger.warning("refused %s: %s", peer, why, extra=event("refused_peer", peer=peer, why=why))
        return Refused(peer=peer, why=why)

    def _admit(self, peer: str, now: float) -> Admitted:
        cert = MembershipCert.issue(self.identity, peer, self.run_id, now + self.lifetime)
        self._note_certified(peer, now + self.lifetime)
        return Admitted(peer=peer, cert=cert.to_msgpack())

    def _note_certified(self, peer: str, expires: float) -> None:
        if peer not in self._certified and len(self._certified) >= MAX_PENDING:
            del self._certified[next(iter(self._certified))]
        self._certified[peer] = max(expires, self._certified.get(peer, float("-inf")))

    def _due(self, peer: str, now: float) -> bool:
        """Whether to announce to `peer` now (and note it)."""
        if now - self._announced.get(peer, -ANNOUNCE_AGAIN) < ANNOUNCE_AGAIN:
            return False
        if len(self._announced) >= MAX_PENDING:
            del self._announced[next(iter(self._announced))]
        self._announced.pop(peer, None)
        self._announced[peer] = now
        return True
