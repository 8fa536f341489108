"""`Succession`: a peer's watch on the scheduler, and the scheduler role it takes over when it is its successor.

Every heartbeat the watch reads the peers' records, keeps gossip links to a few other peers' sidecars (so the
control plane survives the coordinator), and checks that the scheduler's record is still there. Once it has been
missing for longer than a record lives (and no news of it came on gossip: `ScheduleFollower`), the first live peer
of the succession list in the scheduler's newest (signed) schedule becomes the scheduler; that peer starts the role
(built by the factory the peer was given) in a thread of its own. It gives the role back should its follower go
back to the coordinator (whose news shows it alive after all).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from swarm.control.gossip import GossipClient
from swarm.control.records import SwarmRecords
from swarm.events import event
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.wire import PeerRecord, PeerState

logger = logging.getLogger(__name__)

CONTROL_LINKS = 8
"""Gossip links a peer keeps to other peers' sidecars."""
CONTROL_CONNECT_TIMEOUT = 5.0
"""Seconds one dial of another peer's sidecar may take."""
CONTROL_WAVES = 2
"""Waves of dials one call of `Succession.connect_control_plane` makes at most."""


def resume_point(iteration: int, newest_commit: tuple[int, dict[str, Any]]) -> tuple[int, dict[str, Any] | None]:
    """Where a successor on a peer at `iteration` resumes the run: the iterations committed and the shard positions
    of the last commit (None: the newest epoch's). The newest commit it heard of (iteration, positions) counts,
    though the peer may still be averaging or stepping it: rerunning a committed iteration the other peers have left
    behind would wait for their reports of it for ever."""
    committed, positions = newest_commit
    completed = max(iteration, committed + 1)
    return completed, dict(positions) if committed == completed - 1 else None


class Succession:
    """The watch of peer `peer_id` over `follower`'s scheduler.

    :param make_role: builds the scheduler role (`SchedulerRole`'s keyword arguments), or None: never take it over
    :param iteration: this peer's iteration in progress (the role resumes from it and `follower`: `resume_point`)
    :param on_records: called with each read of the peers' records (their membership certificates are noted)
    """

    def __init__(self, peer_id: str, records: SwarmRecords, gossip: GossipClient, follower: ScheduleFollower, *,
                 make_role: Callable[..., Any] | None, iteration: Callable[[], int],
                 on_records: Callable[[dict[str, PeerRecord]], None] = lambda records: None) -> None:
        self.peer_id, self.records, self.gossip, self.follower = peer_id, records, gossip, follower
        self._make_role, self._iteration, self._on_records = make_role, iteration, on_records
        self.role: Any = None
        """The scheduler role, once this peer holds it."""
        self.announced: dict[str, PeerRecord] | None = None
        """The live peers' records as the watch last read them from the DHT."""
        self._connected: set[str] = set()
        self._rng = random.Random()
        self._at_once = CONTROL_LINKS
        """Dials made together (halved after a wave that linked none, doubled after one that linked some)."""
        self._thread: threading.Thread | None = None
        self._role_kwargs: dict[str, Any] = {}

    def start(self, stop: threading.Event, role_kwargs: dict[str, Any]) -> None:
        """Watch in a background thread until `stop` is set or the run finishes."""
        self._role_kwargs = role_kwargs
        threading.Thread(target=self._watch, args=(stop,), name="skippipe-watchdog", daemon=True).start()

    def connect_control_plane(self, records: dict[str, PeerRecord]) -> set[str]:
        """Keep gossip links to CONTROL_LINKS other peers' sidecars among `records` (a read of the live ones): links
        to peers no longer there are let go and made again to others, in a random order (joiners do not all link to
        the same few). The missing links are dialled together, a wave at a time: a dead peer whose record still lives,
        or a frozen one, costs a wave one dial's timeout, where dials one after another cost a joiner 15-27 s on a
        loaded 20-peer host before its admission; a wave that links none (a starved host: handshakes all at once all
        missed the timeout) halves the next. At most CONTROL_WAVES waves a call (the watch calls again a heartbeat
        later): it must not keep the watch from its scheduler for long. Returns the peers linked."""
        self._connected &= set(records)
        candidates = [p for p, r in records.items()
                      if p != self.peer_id and p not in self._connected and r.control_addrs]
        self._rng.shuffle(candidates)
        for _ in range(CONTROL_WAVES):
            if not candidates or len(self._connected) >= CONTROL_LINKS:
                break
            size = min(CONTROL_LINKS - len(self._connected), self._at_once)
            wave, candidates = candidates[:size], candidates[size:]
            try:
                linked = self.gossip.connect_all([records[p].control_addrs[0] for p in wave],
                                                 timeout=CONTROL_CONNECT_TIMEOUT)
            except Exception as e:  # the sidecar is gone (this peer is closing) or refused the addresses
                logger.debug("gossip links to %d peers failed: %s", len(wave), e)
                continue
            made = [p for p in wave if linked.get(records[p].control_addrs[0]) is not None]
            self._connected.update(made)
            # none in time: on a starved host handshakes made at once all miss the timeout (seen at 20 peers on 2
            # cores); fewer at a time then, one by one at worst, and more again once they go through
            self._at_once = min(CONTROL_LINKS, 2 * self._at_once) if made else max(1, len(wave) // 2)
        return set(self._connected)

    def take_records(self, records: dict[str, PeerRecord]) -> dict[str, PeerRecord]:
        """Keep the live peers of a read of the records (not leaving, not draining) as `announced`, and return them:
        the watch's reads, and the joiner's read after its admission, which its first probes and links use."""
        self.announced = {p: r for p, r in records.items() if r.state not in (PeerState.LEAVING, PeerState.DRAINING)}
        return self.announced

    def live(self) -> dict[str, PeerRecord]:
        """The live peers' records as last taken (`take_records`; none before the first)."""
        return self.announced or {}

    def successor(self, records: dict[str, PeerRecord]) -> str | None:
        """The successor of a dead scheduler: the first live peer of the succession list its newest schedule names
        (signed by it, so nobody else can put itself first); a schedule without one names none."""
        known = self.follower.known  # one snapshot (the pipeline's thread replaces it)
        schedule = known.newer or known.in_use
        if schedule is None:
            return None
        named = schedule.meta.get("successors")
        if not isinstance(named, list):
            return None
        return next((p for p in named if isinstance(p, str) and p in schedule.placement and p in records), None)

    def _watch(self, stop: threading.Event) -> None:
        f = self.follower
        while not stop.is_set() and not f.finished.is_set():
            time.sleep(f.heartbeat)
            try:
                records = self.records.fetch_peers()
            except Exception as e:
                logger.debug("watchdog could not read the DHT: %s", e)
                continue
            self._on_records(records)
            live = self.take_records(records)
            self.connect_control_plane(live)
            if f.scheduler in live:
                f.scheduler_seen = time.monotonic()
                continue
            f.candidate = self.successor(live)
            if not f.scheduler_silent() or f.candidate is None:
                continue
            logger.warning("scheduler %s is gone; %s takes over", f.scheduler, f.candidate,
                           extra=event("scheduler_changed", previous=f.scheduler, scheduler=f.candidate))
            f.scheduler, f.scheduler_seen = f.candidate, time.monotonic()
            f.notice.set()
            if f.candidate == self.peer_id:
                self.take_role(stop)

    def take_role(self, stop: threading.Event) -> bool:
        """Hold the scheduler role, in a thread of its own, until `stop` is set, the run is done, or the follower
        follows another scheduler (the role is then given back, and may be taken again later); False if this peer
        holds it already."""
        if self.role is not None or self._thread is not None:
            return False
        self._thread = threading.Thread(target=self._hold_role, args=(stop,), daemon=True, name="skippipe-scheduler")
        self._thread.start()
        return True

    def _hold_role(self, stop: threading.Event) -> None:
        if self._make_role is None:
            logger.error("this peer succeeds the scheduler but was started without a scheduler role to take")
            return
        try:
            f = self.follower
            schedules = list(f.known.all)  # one snapshot: an epoch being taken is in it
            completed, positions = resume_point(self._iteration(), f.committed_positions)
            self.role = self._make_role(**self._role_kwargs, ends_run_on_stop=False)
            self.role.resume(schedules, completed, positions)
            while not stop.is_set() and not self.role.done and f.scheduler == self.peer_id:
                self.role.tick()
            if f.scheduler != self.peer_id:
                # this peer's watch took a live coordinator for dead, and the coordinator's news (a beat, a commit,
                # a newer epoch) brought its follower back to it: one scheduler per run, so the role is given back
                logger.warning("the scheduler %s is alive: this peer gives the scheduler role back", f.scheduler,
                               extra=event("scheduler_role_returned", scheduler=f.scheduler))
            else:
                self.role.finish(stop)
        except Exception:
            logger.exception("the scheduler role failed")
        finally:
            if self.role is not None:
                self.role.close()
            self.role, self._thread = None, None  # it may be this peer's to take again, should that one die
