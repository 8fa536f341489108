"""`Departure`: a peer asked to stop (Ctrl+C, SIGTERM) leaves gracefully when it can, at once when it must.

A placed peer of a running swarm announces DRAINING and serves on until the scheduler plans without it (the
iteration in progress finishes, or, for a data holder, runs again without it: nothing in flight is lost), for at
most `DRAIN_TIMEOUT`. It leaves at once if the run has finished, it holds the scheduler role, or the scheduler is
silent with no other peer to succeed it (nobody would plan its leave or commit another iteration).
"""

from __future__ import annotations

import logging
import threading
import time

from swarm.control.node import Node
from swarm.events import event
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.peer.stage_keeper import StageKeeper
from swarm.peer.succession import Succession
from swarm.wire import PeerState

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT = 120.0
"""Most seconds a peer asked to stop keeps serving while it waits for a schedule without it (a graceful leave)."""


class Departure:
    """Whether a peer asked to stop (`stop` set) keeps serving; its hand-over once the scheduler planned without it."""

    def __init__(self, peer_id: str, stop: threading.Event, node: Node, follower: ScheduleFollower,
                 succession: Succession, keeper: StageKeeper, *, timeout: float = DRAIN_TIMEOUT) -> None:
        self.peer_id, self.stop, self.node = peer_id, stop, node
        self.follower, self.succession, self.keeper = follower, succession, keeper
        self.timeout = timeout
        self._end = 0.0

    def keep_serving(self) -> bool:
        """Asked to stop: whether to serve on (draining); announces DRAINING the first time."""
        schedule = self.follower.schedule
        if self.follower.finished.is_set() or schedule is None or self.peer_id not in schedule.placement \
                or self.node.heartbeat is None or self.succession.role is not None \
                or self.follower.no_scheduler(self.peer_id):
            return False
        if self.keeper.state != PeerState.DRAINING:
            self.keeper.state = PeerState.DRAINING
            self._end = time.monotonic() + self.timeout
            try:
                self.node.heartbeat.beat_now()
            except Exception as e:  # the next heartbeat carries the state anyway
                logger.warning("could not announce draining at once: %s", e)
            logger.info("asked to stop: serving until the scheduler plans without this peer (at most %.0f s)",
                        self.timeout)
        elif time.monotonic() > self._end:
            logger.warning("the scheduler did not plan without this peer within %.0f s: leaving now", self.timeout)
            return False
        return True

    def no_commit_coming(self) -> bool:
        """Asked to stop while no commit will come: the run finishes (its scheduler said so), or this peer stops
        draining (no scheduler left to plan its leave, or the drain timed out). Asked mid-iteration, it announces
        DRAINING at once (`keep_serving`), so that no peer waits for it to succeed a dead scheduler."""
        if not self.stop.is_set():
            return False
        return self.follower.finished.is_set() or (self.succession.role is None and not self.keep_serving())

    def left(self, iteration: int) -> None:
        """The scheduler plans without this draining peer from `iteration` (its stage handed over if it was the
        last: `StageKeeper.hand_over`): it leaves."""
        schedule = self.follower.schedule
        logger.info("left gracefully: schedule epoch %d runs without this peer from iteration %d", schedule.epoch,
                    iteration, extra=event("left", epoch=schedule.epoch, iteration=iteration))
