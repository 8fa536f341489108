"""`FirstPlan`: when the scheduler plans epoch 0, and from what (a saved plan or a fresh one); no I/O.

A swarm's first plan is made once it has settled: enough peers, none new for `SETTLE_SECONDS` (a newcomer probes
its links first), and every link measured, or `LINK_WAIT_SECONDS` without that (a large swarm probes a sample of
its links only, and plans with the gaps filled). Only a peer never seen before restarts the clock: on a loaded
machine a live peer's record can miss a few reads (its heartbeat's store timed out), and a clock restarted by
every such dip kept a 20-peer swarm from ever planning. A saved plan is used once every peer it places is live and none
pins another stage; it is given up for a fresh plan when a peer pins another stage, or when its peers are still
missing after `LINK_WAIT_SECONDS`.
"""

from __future__ import annotations

import logging

from scheduler.schedule import Schedule
from swarm.coordinator.replanner import Replanner
from swarm.net.link_probe import links_complete, unmeasured_links
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

SETTLE_SECONDS = 2.0
"""After the last new peer announced itself, wait this long (for its link probes) before planning."""
LINK_WAIT_SECONDS = 30.0
"""Before the first plan, wait at most this long for the peers to have measured every link (a large swarm
probes a sample of its links only, and plans with the gaps filled)."""
WAIT_REPORT_SECONDS = 10.0
"""How often a swarm waiting for its first plan logs what it waits for."""


class FirstPlan:
    """Epoch 0 of one run. `now` arguments are monotonic seconds.

    :param saved: a saved plan of these peers to start from, or None
    """

    def __init__(self, config: RunConfig, replanner: Replanner, saved: Schedule | None = None) -> None:
        self.config, self.replanner, self.saved = config, replanner, saved
        self._seen: set[str] = set()
        self._settled_since = 0.0
        self._told = float("-inf")

    def plan(self, peers: dict[str, PeerRecord], now: float) -> Schedule | None:
        """Epoch 0 for the live `peers` of this read, or None while the swarm has not settled (or the saved plan
        waits for its peers)."""
        if not self._seen.issuperset(peers):
            self._seen.update(peers)
            self._settled_since = now
        settled = now - self._settled_since
        if len(peers) < self.config.min_peers or settled < SETTLE_SECONDS or \
                not (self.config.profile or links_complete(peers) or settled >= LINK_WAIT_SECONDS):
            self._tell_wait(peers, settled, now)
            return None
        if self.saved is not None:
            missing = sorted(set(self.saved.placement) - set(peers))
            moved = sorted(p for p, s in self.saved.placement.items() if p in peers and peers[p].stage not in (-1, s))
            if not missing and not moved:
                return self.replanner.from_saved(self.saved, peers)
            if not moved and settled < LINK_WAIT_SECONDS:
                return None
            logger.warning("not starting from the saved plan: %s; planning afresh",
                           f"{len(missing)} of its peers are not here: {missing[:5]}" if missing else
                           f"peers pin other stages than it places them on: {moved[:5]}")
        missing_links = [] if self.config.profile else unmeasured_links(peers)
        if missing_links:
            logger.warning("planning with %d of %d links not yet measured (taken as the median link): %s",
                           len(missing_links), len(peers) * (len(peers) - 1) // 2, missing_links[:5])
        return self.replanner.plan(peers, epoch=0, start_iteration=0)

    def _tell_wait(self, peers: dict[str, PeerRecord], settled: float, now: float) -> None:
        """Say what epoch 0 waits for, every `WAIT_REPORT_SECONDS` (a swarm that does not start should say why)."""
        if now - self._told < WAIT_REPORT_SECONDS:
            return
        self._told = now
        unmeasured = 0 if self.config.profile else len(unmeasured_links(peers))
        last = f", the last new one {settled:.0f} s ago" if self._seen else ""
        logger.info("epoch 0 waits: %d of %d peers live (%d seen)%s, %d links unmeasured",
                    len(peers), self.config.min_peers, len(self._seen), last, unmeasured)
