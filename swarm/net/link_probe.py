"""Measure the links to a sample of peers over the real transport; the scheduler plans from these numbers.

Latency is half the median round trip of a small message: the typical one, which on a loaded machine includes the
scheduling delays every activation pays too (the best of a few round trips made the planner's messages 10-15 ms
too fast on the emulated WAN); goodput is the bytes of a probe divided by the time they
take beyond that round trip: a small probe first, then a few MiB if the link carries them in a couple of seconds
(a slow link is measured on the small one, so that it does not hold up the round). Both go through
:class:`~swarm.net.transport.Transport` streams, so they include what every activation pays (stream opening, p2pd,
framing), and are smoothed with an EWMA so one noisy probe does not reshuffle the schedule. :func:`link_matrices`
turns the peers' records into the latency and bandwidth matrices of :class:`scheduler.swarm_view.SwarmView`.
"""

from __future__ import annotations

import logging
import random
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from swarm.constants import (
    MAX_LINKS,
    PROBE_EWMA_ALPHA,
    PROBE_FIRST_BYTES,
    PROBE_GOODPUT_BYTES,
    PROBE_GOODPUT_SECONDS,
    PROBE_PING_BYTES,
    PROBE_PING_TIMEOUT,
    PROBE_SAMPLE_SIZE,
    PROBE_TIMEOUT,
)
from swarm.net.message_jitter import MessageJitter
from swarm.net.transport import PeerUnreachable, Transport, TransportError
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

_PINGS = 5


@dataclass(frozen=True)
class LinkEstimate:
    latency_s: float
    """One-way latency, seconds."""
    bytes_per_s: float
    """Goodput, bytes per second."""
    samples: int = 1


def ewma(old: LinkEstimate | None, new: LinkEstimate, alpha: float = PROBE_EWMA_ALPHA) -> LinkEstimate:
    """Blend a new measurement into the running estimate (the first measurement is taken as is)."""
    if old is None:
        return new
    return LinkEstimate(latency_s=(1 - alpha) * old.latency_s + alpha * new.latency_s,
                        bytes_per_s=(1 - alpha) * old.bytes_per_s + alpha * new.bytes_per_s,
                        samples=old.samples + 1)


class LinkProber:
    """Keeps smoothed link estimates from this peer to the peers it probes.

    :param transport: the peer's transport (probes travel on its streams)
    :param sample_size: peers probed per round; unmeasured peers first, then the stalest
    :param rng: source of the sampling order (seed it for reproducible tests)
    :param jitter: also given each ping's one-way time (half its round trip), until pipeline messages measure it
    """

    def __init__(self, transport: Transport, *, sample_size: int = PROBE_SAMPLE_SIZE, alpha: float = PROBE_EWMA_ALPHA,
                 ping_bytes: int = PROBE_PING_BYTES, goodput_bytes: int = PROBE_GOODPUT_BYTES,
                 timeout: float = PROBE_TIMEOUT, rng: random.Random | None = None,
                 jitter: MessageJitter | None = None):
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.transport, self.sample_size, self.alpha = transport, sample_size, alpha
        self.ping_bytes, self.goodput_bytes, self.timeout = ping_bytes, goodput_bytes, timeout
        self.rng = rng or random.Random()
        self.jitter = jitter
        self._estimates: dict[str, LinkEstimate] = {}
        self._round = 0
        self._probed_at: dict[str, int] = {}
        self._failed: set[str] = set()

    def measure(self, peer_id: str, timeout: float | None = None) -> LinkEstimate:
        """One raw measurement of the link to ``peer_id``, each probe waiting `timeout` (default: the prober's), a
        ping no longer than PROBE_PING_TIMEOUT; raises TransportError if it cannot be reached."""
        timeout = self.timeout if timeout is None else timeout
        ping_timeout = min(timeout, PROBE_PING_TIMEOUT)
        pings = [self.transport.probe(peer_id, self.ping_bytes, timeout=ping_timeout) for _ in range(_PINGS)]
        rtt = statistics.median(pings)
        if self.jitter is not None:
            self.jitter.observe(f"{peer_id}/probe", [p / 2 for p in pings])

        def goodput(size: int) -> float:
            return size / max(self.transport.probe(peer_id, size, timeout=timeout) - rtt, 1e-6)

        first = min(PROBE_FIRST_BYTES, self.goodput_bytes)
        estimate = goodput(first)
        if first < self.goodput_bytes and self.goodput_bytes / estimate <= PROBE_GOODPUT_SECONDS:
            estimate = goodput(self.goodput_bytes)  # a fast link: a small probe is mostly latency and jitter
        return LinkEstimate(latency_s=rtt / 2, bytes_per_s=estimate)

    def probe_round(self, peers: Collection[str], *, enough: int | None = None) -> dict[str, tuple[float, float]]:
        """Probe a sample of ``peers`` (never this peer), update the estimates, return :meth:`links`. With `enough`,
        the round ends once that many of its probes measured their link (the rest wait for a later round)."""
        self._round += 1
        candidates = [p for p in peers if p != self.transport.peer_id]
        self.rng.shuffle(candidates)
        candidates.sort(key=lambda p: self._probed_at.get(p, -1))  # never probed first, then the stalest
        measured = 0
        for peer in candidates[: self.sample_size]:
            if enough is not None and measured >= enough:
                break
            self._probed_at[peer] = self._round
            try:
                self._estimates[peer] = ewma(self._estimates.get(peer), self.measure(peer), self.alpha)
                self._failed.discard(peer)
                measured += 1
            except (TransportError, ConnectionError) as e:
                logger.warning("probing %s failed: %s", peer, e)
                if isinstance(e, PeerUnreachable):  # no stream opened; a refusal (a joiner that has not admitted
                    self._failed.add(peer)          # this peer yet) or a timeout says nothing of the link
        return self.links()

    def remeasure(self, peer_id: str, timeout: float | None = None) -> LinkEstimate:
        """Measure the link to ``peer_id`` now and take the measurement as its estimate, unsmoothed: called where the
        pipeline's own messages say the link changed (`swarm.peer.send_times`), a step the EWMA would follow over
        several rounds. Raises TransportError if it cannot be reached (the old estimate stays)."""
        self._round += 1
        self._probed_at[peer_id] = self._round
        self._estimates[peer_id] = self.measure(peer_id, timeout)
        self._failed.discard(peer_id)
        return self._estimates[peer_id]

    def estimate(self, peer_id: str) -> LinkEstimate | None:
        """The current estimate of the link to ``peer_id`` (None if never measured)."""
        return self._estimates.get(peer_id)

    def probed(self) -> set[str]:
        """Peers probed at least once, whether or not they answered."""
        return set(self._probed_at)

    def forget(self, peer_id: str) -> None:
        """Drop a departed peer's estimate."""
        self._estimates.pop(peer_id, None)
        self._probed_at.pop(peer_id, None)
        self._failed.discard(peer_id)

    def unreachable(self) -> tuple[str, ...]:
        """Peers whose last probe failed (the ``unreachable`` of this peer's PeerRecord; a link once measured keeps
        its estimate in ``links`` and is not listed)."""
        return tuple(sorted(p for p in self._failed if p not in self._estimates))[:MAX_LINKS]

    def links(self) -> dict[str, tuple[float, float]]:
        """Peer id -> (latency s, goodput bytes/s): the ``links`` of this peer's PeerRecord (freshest first)."""
        ordered = sorted(self._estimates, key=lambda p: -self._probed_at.get(p, 0))[:MAX_LINKS]
        return {p: (self._estimates[p].latency_s, self._estimates[p].bytes_per_s) for p in ordered}


UNREACHABLE_PENALTY = 10.0
"""A link its probes could not reach costs this many times the worst measured one (latency up, goodput down)."""


def link_matrices(records: Mapping[str, PeerRecord], order: Sequence[str], *, default_latency: float,
                  default_bandwidth: float) -> tuple[np.ndarray, np.ndarray]:
    """Latency (s) and bandwidth (bytes/s) matrices over ``order`` from the peers' measured links.

    A link i -> j not measured by i takes j's measurement of j -> i, else the median of all measured links, else
    the defaults (links are probed by sampling, so a large swarm always has gaps). A pair measured neither way that
    either side's probes could not reach (`PeerRecord.unreachable`) gets UNREACHABLE_PENALTY times the worst
    measured link instead, so paths avoid it where they can. The diagonal is 0 / inf-free.
    """
    n = len(order)
    lat = np.full((n, n), np.nan)
    bw = np.full((n, n), np.nan)
    index = {p: i for i, p in enumerate(order)}
    for i, p in enumerate(order):
        record = records.get(p)
        for q, (latency, bandwidth) in (record.links.items() if record else ()):
            if q in index and q != p:
                lat[i, index[q]], bw[i, index[q]] = latency, bandwidth
    lat = np.where(np.isnan(lat), lat.T, lat)
    bw = np.where(np.isnan(bw), bw.T, bw)
    off = ~np.eye(n, dtype=bool)
    known = ~np.isnan(lat) & off
    fill_lat = float(np.median(lat[known])) if known.any() else default_latency
    fill_bw = float(np.median(bw[known])) if known.any() else default_bandwidth
    failed = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(order):
        record = records.get(p)
        for q in (record.unreachable if record else ()):
            if q in index and q != p:
                failed[i, index[q]] = True
    cut = (failed | failed.T) & np.isnan(lat) & off
    lat[cut] = UNREACHABLE_PENALTY * (float(lat[known].max()) if known.any() else default_latency)
    bw[cut] = (float(bw[known].min()) if known.any() else default_bandwidth) / UNREACHABLE_PENALTY
    lat = np.where(np.isnan(lat), fill_lat, lat)
    bw = np.where(np.isnan(bw), fill_bw, bw)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, max(fill_bw, default_bandwidth))
    return lat, bw


def unmeasured_links(records: Mapping[str, PeerRecord]) -> list[tuple[str, str]]:
    """Pairs of these peers measured in neither direction (the first plan waits a while for those; the planner
    fills them with the median link, or with a penalty where a probe could not reach: `link_matrices`). A pair
    found unreachable is still waited for: a relayed peer's probes fail until its relay knows it."""
    ids = list(records)
    return [(p, q) for i, p in enumerate(ids) for q in ids[i + 1:] if q not in records[p].links and
            p not in records[q].links]


def links_complete(records: Mapping[str, PeerRecord]) -> bool:
    """Whether every pair of these peers has been measured in at least one direction."""
    return not unmeasured_links(records)
