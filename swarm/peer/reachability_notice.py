"""How a joining peer can be reached, decided once at start, and what it tells its volunteer when it cannot.

A peer that cannot be dialled (behind NAT or a firewall, nothing forwarded) still trains: it keeps a reservation
on the coordinator (its relay) and others reach it through that, at the relay's cost. It says so in its signed
record (`PeerRecord.reachability`) and in one clear line to its volunteer, with what to do about it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from swarm.control.messages import NotDialable, SitOut
from swarm.events import event
from swarm.net.reachability import ADVICE, decide
from swarm.peer.options import PeerOptions
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)


def join_reachability(options: PeerOptions) -> dict[str, Any]:
    """`Node.start_dht`'s reachability arguments for this peer; logs the notice if it will be relayed."""
    reachability = decide(options.reachability, options.host, options.announce_addrs)
    if reachability == "relayed":
        logger.warning("this peer cannot be dialled from outside its network (it listens on %s and announces no "
                       "public address): others reach it through the coordinator's relay, which costs bandwidth "
                       "and latency; to be reached directly, %s", options.host, ADVICE,
                       extra=event("reachability", reachability=reachability, advice=ADVICE))
    elif reachability == "public":
        logger.info("this peer expects to be dialled directly (%s) and relays for peers that cannot be",
                    ", ".join(options.announce_addrs) or options.host,
                    extra=event("reachability", reachability=reachability, advice=""))
    return dict(reachability=reachability, announce=options.announce_addrs)


FETCH_TTL = 5.0
"""Seconds a fresh read of the records serves the hook before the watch's first read (a joiner dials its whole
probe sample at once; a DHT read each, on a loaded host, took seconds apiece)."""
REFETCH_AFTER = 1.0
"""A peer missing from a read at least this old is looked up again (it may have joined since)."""


def announced_addresses(announced: Callable[[], Mapping[str, PeerRecord] | None],
                        fetch: Callable[[], Mapping[str, PeerRecord]],
                        clock: Callable[[], float] = time.monotonic) -> Callable[[str], Sequence[str]]:
    """The transport's `addresses` hook: a relayed peer's circuit addresses, from the latest records this peer
    read, or, before there are any, from a read of the DHT (`fetch`; the transport calls the hook off its loop)
    kept for `FETCH_TTL` seconds. A peer that is not relayed gets none: p2pd's own peer routing knows its direct
    addresses, and a dead peer is then taken for unreachable at once instead of after another dial."""
    cache: dict[str, Any] = {"at": -float("inf"), "records": {}}

    def read(peer: str) -> PeerRecord | None:
        records = announced()
        if records is not None:
            return records.get(peer)
        age = clock() - cache["at"]
        if age > FETCH_TTL or (peer not in cache["records"] and age >= REFETCH_AFTER):
            cache["records"], cache["at"] = dict(fetch()), clock()
        return cache["records"].get(peer)

    def addresses(peer: str) -> Sequence[str]:
        record = read(peer)
        if record is None or record.reachability != "relayed":
            return ()
        return tuple(a for a in record.addresses if "/p2p-circuit" in a)
    return addresses


class DialVerdict:
    """What this peer heard about its reachability: the coordinator's dial-back (`NotDialable`), told once per set
    of addresses found undialable, and the scheduler's `SitOut` (a member of its own stage cannot reach it), each
    with what will happen and what to do. A peer whose volunteer left its reachability to it (`leave_to_relay`)
    leaves and restarts relayed on a relaying coordinator's verdict; any other is only told how to.
    """

    def __init__(self, me: str) -> None:
        self.me = me
        self.heard: set[tuple[str, ...]] = set()
        self.restart_as: str | None = None
        """"relayed" once this peer left to restart relayed (`swarm.cli` restarts its process so)."""
        self._leave: threading.Event | None = None

    def leave_to_relay(self, stop: threading.Event) -> None:
        """On a relaying coordinator's verdict, set `stop` (the peer leaves as if asked to: drained first if it is
        placed, usually it is not yet) and say `restart_as` "relayed"."""
        self._leave = stop

    @property
    def reachability(self) -> str:
        """What this peer's record says of it when it set no reachability itself: "unreachable" once the
        coordinator found that none of its direct addresses takes a connection, "" before (not known)."""
        return "unreachable" if self.heard else ""

    def on_not_dialable(self, message: NotDialable) -> None:
        """The coordinator's verdict (the caller checked that the coordinator sent it)."""
        if message.peer != self.me or message.tried in self.heard:
            return
        self.heard.add(message.tried)
        switch = message.relay and self._leave is not None and not self._leave.is_set() and self.restart_as is None
        if switch:
            what = ("others reach it only over connections it opens itself, so it restarts relayed: the "
                    "coordinator's relay carries its streams")
        elif message.relay:
            what = ("others reach it only over connections it opens itself; restart it with --reachability "
                    "relayed and the coordinator relays for it")
        else:
            what = ("streams from others to it fail, so it is routed around and may be declared gone (this run's "
                    "coordinator does not relay)")
        logger.warning("the coordinator could not connect to this peer at %s: %s; to be reached directly, %s",
                       ", ".join(message.tried), what, ADVICE,
                       extra=event("not_dialable", tried=list(message.tried), relay=message.relay, advice=ADVICE))
        if switch:
            logger.warning("this peer leaves the run and restarts relayed",
                           extra=event("restarting", reachability="relayed"))
            self.restart_as = "relayed"
            self._leave.set()

    def on_sit_out(self, message: SitOut) -> None:
        """The scheduler leaves this peer out for a while (the caller checked that the scheduler sent it)."""
        if message.peer != self.me:
            return
        logger.warning("this peer and %s, both of stage %d, cannot reach each other, so they cannot average their "
                       "gradients: the scheduler leaves this peer out for %.0f s, then places it again; to be "
                       "reached directly, %s", message.partner, message.stage, message.seconds, ADVICE,
                       extra=event("estranged", peer=message.peer, partner=message.partner, stage=message.stage,
                                   seconds=message.seconds))
