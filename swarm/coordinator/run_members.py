"""`RunMembers`: who is a member of the run now, as the records in the DHT say, for the coordinator's relay.

A peer is a member while its live, self-signed record carries a membership certificate of this run from one of the
issuers (`swarm.control.membership.cert_problem`). Reads are cached for `REFRESH` seconds: the relay asks for every
stream it forwards, and a flood of streams must not become a flood of DHT reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping

from hivemind.utils import get_dht_time

from swarm.control.membership import cert_problem
from swarm.wire import PeerRecord

REFRESH = 5.0
"""Seconds a read of the records answers for."""
MISS_REFRESH = 1.0
"""Seconds after which a peer not among the members makes a new read (it may have been admitted since)."""


class RunMembers:
    """``members(peer)``: whether `peer` is a member of `run` (issuers: who admits to it). Thread-safe.

    :param fetch: every live, validly signed peer record of the run, by peer id (`SwarmRecords.fetch_peers`)
    """

    def __init__(self, fetch: Callable[[], Mapping[str, PeerRecord]], run: str, issuers: Collection[str],
                 refresh: float = REFRESH) -> None:
        self.fetch, self.run, self.issuers, self.refresh = fetch, run, frozenset(issuers), refresh
        self._lock = threading.Lock()
        self._read_at = -refresh
        self._members: frozenset[str] = frozenset()

    def __call__(self, peer: str) -> bool:
        with self._lock:
            age = time.monotonic() - self._read_at
            if age > self.refresh or (peer not in self._members and age > MISS_REFRESH):
                now = get_dht_time()
                try:
                    records = self.fetch()
                except Exception:  # the DHT did not answer: the last read stands until the next try
                    records = None
                if records is not None:
                    self._members = frozenset(p for p, r in records.items() if cert_problem(
                        r.cert, peer=p, run=self.run, issuers=self.issuers, now=now) is None)
                self._read_at = time.monotonic()
            return peer in self._members
