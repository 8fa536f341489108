"""`PlacementRelease`: a placed peer that cannot serve its placement gives it up, and is placed afresh.

A joiner whose stage's state does not come holds nothing to serve. It does not exit: it announces LEAVING, so that
the scheduler plans without it as without a peer that left, waits for that epoch, then announces JOINING again. The
scheduler takes it back as a peer that holds no state (`Liveness.stateless`), a joiner wherever it places it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scheduler.schedule import Schedule
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.wire import PeerState

logger = logging.getLogger(__name__)


class PlacementRelease:
    """Gives peer `peer_id`'s placement up.

    :param set_state: sets the state the peer's record announces
    :param beat_now: publishes the peer's record at once
    :param timeout: most seconds to wait for an epoch without the peer
    """

    def __init__(self, peer_id: str, follower: ScheduleFollower, *, set_state: Callable[[PeerState], None],
                 beat_now: Callable[[], object], timeout: float) -> None:
        self.peer_id, self.follower = peer_id, follower
        self.set_state, self.beat_now, self.timeout = set_state, beat_now, timeout

    def release(self, schedule: Schedule, stop: threading.Event, halt: threading.Event) -> Schedule | None:
        """Leave `schedule`'s placement unserved. Returns the epoch without this peer (this peer announces JOINING
        again), or None if the run ended or `stop` or `halt` was set first; TimeoutError if no such epoch comes
        within the timeout (no scheduler is planning)."""
        self._announce(PeerState.LEAVING)
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            if stop.is_set() or halt.is_set() or self.follower.finished.is_set():
                return None
            later = self.follower.poll_newer()
            if later is not None and self.peer_id not in later.placement:
                self.follower.drop_pending()
                self._announce(PeerState.JOINING)
                return later
            self.follower.notice.wait(0.5)
        raise TimeoutError(f"no epoch without this peer came within {self.timeout:.0f} s of giving up its placement "
                           f"in epoch {schedule.epoch}")

    def _announce(self, state: PeerState) -> None:
        self.set_state(state)
        try:
            self.beat_now()
        except Exception as e:  # the next heartbeat carries the state anyway
            logger.warning("could not announce %s at once: %s", state.name.lower(), e)
