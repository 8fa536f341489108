"""`Members`: a peer's admission to its run, and which other peers it takes anything from.

A joiner's record carries its proof of the join token until the scheduler admits it: its certificate comes on
gossip (`Admitted`), goes into its record from then on, and the joiner only then measures links and asks to be
placed; a refusal (`Refused`) ends the join with the scheduler's reason. Every other peer is a stranger until
this peer has seen a valid certificate of it, in its record or on gossip, from a trusted issuer (the coordinator,
the scheduler it follows, or a successor the scheduler named): the transport refuses strangers' streams. The
peers of a schedule this peer adopted are members too: its scheduler signed it and plans members only, so a
joiner takes its new group's messages before it has read their certificates.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping

from hivemind.utils import get_dht_time

from swarm.control.membership import MembershipCert, cert_problem, token_proof
from swarm.control.messages import Admitted, Join, Refused
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

MAX_MEMBERS = 1 << 16
"""Certificates remembered (each a peer id and an expiry)."""
ASK_AGAIN = 5.0
"""Seconds between a waiting joiner's announcements."""


class NotAdmitted(RuntimeError):
    """The run's scheduler did not admit this peer: the message says why."""


class Members:
    """Peer `me`'s view of run `run_id`'s members.

    :param token: the join token this peer was given (None: it relies on an allow list or an open run)
    :param issuers: who may issue certificates now: the coordinator, the scheduler followed, its named successors
    """

    def __init__(self, me: str, run_id: str, token: str | None, issuers: Callable[[], Collection[str]]) -> None:
        self.me, self.run_id, self._issuers = me, run_id, issuers
        self.proof = token_proof(token, me, run_id) if token else b""
        """What this peer's record carries to be admitted."""
        self.cert = b""
        """This peer's certificate once admitted (it goes into its record)."""
        self.refused: str | None = None
        self._decided = threading.Event()
        self._expiry: dict[str, float] = {}
        self._banned: set[str] = set()
        self._planned: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def admits(self, peer: str) -> bool:
        """Whether `peer` is a member (or an issuer): the transport's `admitted` hook, so quick and lock-light."""
        if peer == self.me or peer in self._issuers():
            return True
        if peer in self._banned:
            return False
        return peer in self._planned or self._expiry.get(peer, 0.0) > get_dht_time()

    def join_message(self) -> Join:
        """This joiner's announcement, with its proof of the token: refused, it hears why on gossip (its record,
        without a valid proof, is refused by the DHT and never reaches the scheduler)."""
        return Join(peer=self.me, admission=self.proof, sent=get_dht_time())

    def follow(self, placement: Collection[str]) -> None:
        """The peers of the schedule this peer now follows (signed by its scheduler) are members."""
        self._planned = frozenset(placement)

    def on_control(self, sender: str, message: Admitted | Refused) -> None:
        """The scheduler's `Admitted` or `Refused` (the caller checked that `sender` is the scheduler)."""
        if isinstance(message, Refused):
            if message.peer == self.me:
                self.refused = message.why or "no reason given"
                self._decided.set()
            elif message.evicted:  # no more input from it, whatever certificate it still holds
                with self._lock:
                    self._banned.add(message.peer)
                    self._expiry.pop(message.peer, None)
            return
        if self._take(message.peer, message.cert) and message.peer == self.me:
            self.cert = message.cert
            self._decided.set()

    def observe(self, records: Mapping[str, PeerRecord]) -> None:
        """A read of the peers' records: note the valid certificates they carry."""
        for peer, record in records.items():
            if record.cert:
                self._take(peer, record.cert)

    def wait(self, stop: threading.Event, timeout: float, *, over: threading.Event | None = None,
             ask: Callable[[], None] | None = None) -> float:
        """Until the scheduler admits this peer; raises `NotAdmitted` when it refuses or says nothing in time.
        Returns at once when `stop` or `over` (the run finished) is set. `ask` (announce this joiner to the
        scheduler) is called at once and every `ASK_AGAIN` seconds meanwhile: gossip may lose an announcement.
        Returns the seconds it waited."""
        start = time.monotonic()
        end = start + timeout
        asked = float("-inf")
        while not self._decided.is_set() and not stop.is_set() and not (over is not None and over.is_set()) \
                and time.monotonic() < end:
            if ask is not None and time.monotonic() - asked >= ASK_AGAIN:
                asked = time.monotonic()
                ask()
            self._decided.wait(0.2)
        if over is not None and over.is_set() and self.refused is None:
            return time.monotonic() - start
        if self.refused is not None:
            raise NotAdmitted(f"the scheduler of run {self.run_id} refused this peer: {self.refused}")
        if not self.cert and not stop.is_set():
            raise NotAdmitted(f"the scheduler of run {self.run_id} did not admit this peer within {timeout:.0f} s"
                              + ("" if self.proof else " (it has no join token: pass --token)"))
        return time.monotonic() - start

    def _take(self, peer: str, raw: bytes) -> bool:
        """Remember `peer`'s certificate `raw` if it is valid; False (logged) if not."""
        if peer in self._banned:
            return False
        problem = cert_problem(raw, peer=peer, run=self.run_id, issuers=self._issuers(), now=get_dht_time())
        if problem is not None:
            logger.debug("certificate of %s not taken: %s", peer, problem)
            return False
        expires = MembershipCert.from_msgpack(raw).expires
        with self._lock:
            if peer not in self._expiry and len(self._expiry) >= MAX_MEMBERS:
                now = get_dht_time()
                self._expiry = {p: t for p, t in self._expiry.items() if t > now}
            if peer not in self._expiry:
                logger.debug("%s is a member of run %s", peer, self.run_id)
            self._expiry[peer] = max(expires, self._expiry.get(peer, 0.0))
        return True
