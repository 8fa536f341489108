"""`LinkWatch`: a peer's measurements of its links, kept fresh in the background.

The planner's cost matrix comes from these: latency and goodput to a sample of the announced peers, measured
before the peer announces itself and then for peers that announce themselves later (joiners), and now and then
again for the stalest links. The heartbeat publishes them with the peer's record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from swarm.events import event
from swarm.net.link_probe import LinkProber
from swarm.net.transport import TransportError
from swarm.peer.send_times import SendTimes, moved
from swarm.wire import PeerRecord, WireError

logger = logging.getLogger(__name__)

LINK_LOOK_PERIOD = 1.0
"""Seconds between two looks for announced peers this peer has never probed (joiners): the first epoch is planned,
and a joiner placed, once the records show its links, so a look every few seconds would hold each of them up."""
LINK_PROBE_PERIOD = 5.0
"""Seconds between two tries again of the peers whose last probe failed (one still starting up, or one behind a
NAT): each try may wait out a connection timeout."""
LINK_REFRESH_PERIOD = 300.0
"""Seconds between two re-measurements of the stalest links."""
FIRST_LINKS = 3
"""Links a joiner measures before it publishes them and goes on (to be placed): its whole first round, one peer
after another on a loaded 20-peer host, took 14-69 s, a frozen peer's probe waiting out its timeout; the planner fills
the links still unmeasured with the median until the background thread has measured them."""
SUSPECT_DELAY = 5.0
"""Seconds a link whose peer did not answer a probe waits before it is re-measured: a dead peer is declared
gone by then (`gone`), and its re-measurement, which would wait out `SUSPECT_TIMEOUT`, is skipped."""
SUSPECT_TIMEOUT = 10.0
"""Seconds each probe of a suspect link's re-measurement waits (the background thread's other work waits on it)."""


class LinkWatch:
    """Links of peer `peer_id` (peer -> (latency s, bandwidth B/s)), measured with `prober`.

    :param announced: the announced peers' records (the peer's latest read of the DHT)
    :param skip: peers never probed (the coordinator runs no pipeline)
    :param measured: called from the background thread after a round measured a link it had not (the peer publishes
      its record at once rather than at its next heartbeat)
    :param gone: the peers the scheduler declared gone (their suspect links are not re-measured)
    """

    def __init__(self, prober: LinkProber, peer_id: str, announced: Callable[[], dict[str, PeerRecord]], *,
                 skip: frozenset[str] = frozenset(), measured: Callable[[], None] | None = None,
                 gone: Callable[[], Collection[str]] = frozenset) -> None:
        self.prober, self.peer_id, self._announced, self.skip = prober, peer_id, announced, skip
        self._measured, self._gone = measured, gone
        self.links: dict[str, tuple[float, float]] = {}
        self.unreachable: tuple[str, ...] = ()
        """Peers its probes could not reach at their last try."""
        self.send_times = SendTimes()
        self._due: set[str] = set()
        self._suspects: dict[str, float] = {}
        """Peers that did not answer a probe, by when (`suspect`)."""
        self._due_lock = threading.Lock()

    def sent(self, peer: str, seconds: float, nbytes: int) -> None:
        """A pipeline message of `nbytes` reached `peer` in `seconds` (any sender thread): where the link's last
        sends are far off its estimate (`SendTimes`), it is re-measured at the next look and published at once."""
        if self.send_times.due(peer, seconds, nbytes, self.prober.estimate(peer)):
            logger.info("sends to %s run far off its link's estimate: re-measuring it", peer)
            with self._due_lock:
                self._due.add(peer)

    def suspect(self, peer: str) -> None:
        """`peer` did not answer a probe (any thread; a microbatch or its averaging contribution was overdue): it is
        dead, or the link to it is so congested that a byte waits behind what is queued on it, and this peer's
        pipeline now goes around it, so its sends no longer tell which. Unless it is declared gone meanwhile, the link
        is re-measured `SUSPECT_DELAY` later (at most once per `SendTimes` recheck wait) and published: a congested
        link then costs what it does, and the paths are re-planned around it (the detour lasts only until the next
        epoch)."""
        with self._due_lock:
            self._suspects.setdefault(peer, time.monotonic())

    def remeasure_due(self) -> bool:
        """Re-measure the links due for it (`sent`, `suspect`); True if an estimate changed."""
        now = time.monotonic()
        with self._due_lock:
            due, self._due = self._due, set()
            ripe = {p for p, since in self._suspects.items() if now - since >= SUSPECT_DELAY}
            self._suspects = {p: since for p, since in self._suspects.items() if p not in ripe}
        if ripe:  # (the declared gone are read only then: this runs every look)
            ripe -= due | set(self._gone())
        suspects = {p for p in ripe if self.send_times.claim(p)}
        for peer in sorted(suspects):
            logger.info("%s did not answer a probe and is not declared gone: re-measuring the link", peer)
        changed = False
        for peer in sorted(due | suspects):
            before = self.prober.estimate(peer)
            try:
                after = self.prober.remeasure(peer, SUSPECT_TIMEOUT if peer in suspects else None)
            except (TransportError, ConnectionError, WireError, TimeoutError) as e:
                logger.warning("re-measuring the link to %s failed: %s", peer, e)
                continue
            was = [before.latency_s, before.bytes_per_s] if before else None
            logger.info("link to %s re-measured: %s -> %.3f s, %.2f MB/s", peer,
                        f"{was[0]:.3f} s, {was[1] / 1e6:.2f} MB/s" if was else "unmeasured", after.latency_s,
                        after.bytes_per_s / 1e6,
                        extra=event("link_remeasured", peer=peer, was=was, now=[after.latency_s, after.bytes_per_s]))
            self.send_times.remeasured(peer, moved(before, after))
            changed = changed or after != before
        if changed:
            self.links = self.prober.links()
        return changed

    def probe(self, *, only_unmeasured: bool = False, retry_unreached: bool = True, enough: int | None = None) -> bool:
        """One round over a sample of the announced peers (with `only_unmeasured`, those never probed, and with
        `retry_unreached` those not reached at the last try; with `enough`, until that many links are measured);
        True if it measured a link it had not."""
        before = set(self.links)
        try:
            others = [p for p in self._announced() if p != self.peer_id and p not in self.skip]
            if only_unmeasured:  # and those its last try could not reach: a peer still starting is tried again
                failed = set(self.prober.unreachable()) if retry_unreached else set()
                others = [p for p in others if p not in self.prober.probed() or p in failed]
            if others:
                self.links = self.prober.probe_round(others, enough=enough)
                self.unreachable = self.prober.unreachable()
        except (TransportError, WireError, TimeoutError) as e:
            logger.warning("link probing failed: %s", e)
        return bool(set(self.links) - before)

    def start(self, stop: threading.Event, finished: threading.Event) -> float:
        """Measure a first few links now and publish them at once (the scheduler places a joiner once its record
        shows links), then keep probing in a background thread until `stop` or `finished` is set: the rest of the
        sample at its first look, a second later. Returns the seconds the first few took."""
        start = time.monotonic()
        if self.probe(enough=FIRST_LINKS):
            self._publish()
        threading.Thread(target=self._keep_probing, args=(stop, finished), name="skippipe-prober",
                         daemon=True).start()
        return time.monotonic() - start

    def _keep_probing(self, stop: threading.Event, finished: threading.Event) -> None:
        refreshed = retried = time.monotonic()
        while not stop.wait(LINK_LOOK_PERIOD) and not finished.is_set():
            now = time.monotonic()
            refresh, retry = now - refreshed > LINK_REFRESH_PERIOD, now - retried >= LINK_PROBE_PERIOD
            refreshed, retried = (now if refresh else refreshed), (now if retry else retried)
            remeasured = self.remeasure_due()
            if self.probe(only_unmeasured=not refresh, retry_unreached=retry) or remeasured:
                self._publish()

    def _publish(self) -> None:
        if self._measured is None:
            return
        try:
            self._measured()
        except Exception as e:  # the next heartbeat carries the links anyway
            logger.warning("could not publish the measured links at once: %s", e)
