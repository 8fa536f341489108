"""`Pings`: the scheduler's own witness that a peer reported unreachable is alive or not.

One peer's report that it could not reach another is not believed alone (`UnreachableReports`). The heartbeat is
a slow second witness: a loaded swarm beats every 15 s, and a heartbeat is overdue only some periods later. So on
a lone report the scheduler pings the peer over gossip, which needs no direct connection (a peer behind NAT is
pinged as well as a public one): a live peer's gossip thread answers within a second or two, even while its
main loop computes, while a frozen host, or one whose link is down, never does. An unanswered ping corroborates the
report; an answered one says that the peer is alive, whatever its heartbeat's age says.

Pings are signed gossip like every control message: only the peer itself can answer its ping (the answer's sender
is checked, and its nonce is random), and one peer in flight at a time per target bounds what reports can make
the scheduler send.
"""

from __future__ import annotations

import secrets

from swarm.control.messages import MAX_NONCE, Ping

PING_FLOOR = 3.0
"""The least seconds a ping waits for its answer: gossip on a loaded 2-core machine delivers well within it."""
PING_CAP = 6.0
"""The most seconds a ping waits: past it, the heartbeat would be the quicker witness on a swarm beating every
few seconds, and the ping is there for the swarms that beat slowly."""


def ping_timeout(heartbeat: float) -> float:
    """Seconds a ping waits for its answer: one heartbeat period (a run beats slowly because its machines are
    loaded, and gossip is slower there too), within `PING_FLOOR` and `PING_CAP`."""
    return min(PING_CAP, max(PING_FLOOR, heartbeat))


class Pings:
    """The pings in flight, one per peer at most.

    :param timeout: seconds a ping waits for its answer
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._out: dict[str, tuple[int, float]] = {}
        """Peer -> (the nonce of its ping, when it was sent)."""

    def send(self, peer: str, now: float) -> Ping | None:
        """A ping for `peer`, or None if one is in flight already."""
        if peer in self._out:
            return None
        nonce = secrets.randbelow(MAX_NONCE + 1)
        self._out[peer] = (nonce, now)
        return Ping(peer=peer, nonce=nonce)

    def answer(self, sender: str, nonce: int) -> bool:
        """Whether `sender`'s answer is to its own ping in flight (which is then done)."""
        sent = self._out.get(sender)
        if sent is None or sent[0] != nonce:
            return False
        del self._out[sender]
        return True

    def sent(self, peer: str) -> float | None:
        """When the ping in flight to `peer` was sent; None if none is."""
        out = self._out.get(peer)
        return out[1] if out is not None else None

    def unanswered(self, now: float) -> list[str]:
        """The peers whose ping waited its timeout out (each is done)."""
        late = [p for p, (_, sent) in self._out.items() if now - sent >= self.timeout]
        for p in late:
            del self._out[p]
        return late
