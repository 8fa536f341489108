"""`DialBack`: the coordinator checks that each member can be dialled at the addresses it announces, and tells one
that cannot.

A volunteer behind a home router announces the private address it binds; others' streams to it then fail, it is
detoured around and perhaps declared gone, and nothing would tell it why. The coordinator sits where other peers
are (on the public side), so a TCP connection it opens to an announced address is what another peer's would be.
Each member whose record says it can be dialled (reachability "public" or unsaid; a "relayed" peer knows it cannot)
is dialled back once per set of announced addresses; if none takes a connection, the member is told
(`NotDialable`, a few times: gossip may lose one), and learns what will happen and what it can do.

Only members are dialled, at most `MAX_TRIED` addresses each: a stranger's record cannot make the coordinator
connect to arbitrary hosts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor

from swarm.control.messages import NotDialable
from swarm.events import event
from swarm.net.reachability import dial_back, tcp_endpoint
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

PERIOD = 5.0
"""Seconds between two reads of the records."""
MAX_TRIED = 4
"""Announced direct addresses dialled per peer."""
TELL_TIMES = 3
"""How often a peer that cannot be dialled is told (one per read after the first)."""
WORKERS = 4


def addresses_to_try(record: PeerRecord) -> tuple[str, ...]:
    """The direct TCP addresses of `record` a dial-back tries (none for a peer that says it is relayed)."""
    if record.reachability == "relayed":
        return ()
    return tuple(a for a in record.addresses if tcp_endpoint(a) is not None)[:MAX_TRIED]


class DialBack:
    """Dials back members in a background thread; `tell(NotDialable)` gossips the verdict.

    :param fetch: every live, validly signed peer record of the run (`SwarmRecords.fetch_peers`)
    :param members: whether a peer is a member of the run (`RunMembers`)
    :param relay: the coordinator relays for peers behind NAT (said in the verdict)
    :param exempt: peers never dialled (the coordinator itself)
    """

    def __init__(self, fetch: Callable[[], Mapping[str, PeerRecord]], members: Callable[[str], bool],
                 tell: Callable[[NotDialable], None], *, relay: bool, exempt: Collection[str] = (),
                 period: float = PERIOD) -> None:
        self.fetch, self.members, self.tell, self.relay, self.period = fetch, members, tell, relay, period
        self.exempt = frozenset(exempt)
        self.verdicts: dict[str, tuple[tuple[str, ...], bool]] = {}
        """Peer -> (the addresses dialled, whether one took a connection)."""
        self._told: dict[str, int] = {}
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="skippipe-dial-back")
        self._thread = threading.Thread(target=self._loop, name="skippipe-dial-back", daemon=True)

    def start(self) -> DialBack:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.period + 1)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.check(self.fetch())
            except Exception as e:  # the DHT did not answer: next time
                logger.debug("dial-back: reading the records failed: %s", e)

    def check(self, records: Mapping[str, PeerRecord]) -> None:
        """Dial back the members whose addresses are new; tell again those still found not dialable."""
        for peer, record in records.items():
            tried = addresses_to_try(record)
            if peer in self.exempt or not tried:
                continue
            with self._lock:
                known = self.verdicts.get(peer)
                if known is not None and known[0] == tried:
                    if not known[1] and self._told.get(peer, 0) < TELL_TIMES:
                        self._told[peer] = self._told.get(peer, 0) + 1
                        self._tell(NotDialable(peer=peer, tried=tried, relay=self.relay))
                    continue
                if peer in self._pending or not self.members(peer):
                    continue
                self._pending.add(peer)
            self._pool.submit(self._dial, peer, tried)

    def _dial(self, peer: str, tried: tuple[str, ...]) -> None:
        """Dial, tell a peer found not dialable, then record the verdict: one a reader sees has been told once."""
        try:
            ok = bool(dial_back(tried))
        except BaseException:
            with self._lock:
                self._pending.discard(peer)
            raise
        if not ok:
            logger.warning("%s cannot be dialled at %s", peer, ", ".join(tried),
                           extra=event("not_dialable", peer=peer, tried=list(tried)))
            self._tell(NotDialable(peer=peer, tried=tried, relay=self.relay))
        with self._lock:
            self.verdicts[peer] = (tried, ok)
            self._told[peer] = 0 if ok else 1
            self._pending.discard(peer)

    def _tell(self, message: NotDialable) -> None:
        try:
            self.tell(message)
        except Exception as e:  # gossip is down for now: the next read tells again
            logger.debug("dial-back: could not tell %s: %s", message.peer, e)

