"""`CarriedEpochs`: the schedule epochs the scheduler's notices carried, until the pipeline's thread takes them.

A notice arrives on the gossip thread and is parsed there (`ScheduleNotice.carried`, as strictly as a DHT record);
the epochs are handed over in arrival order, each to be kept in turn, so that one that runs before the next (a
bridge) is not lost when two notices come between two looks.
"""

from __future__ import annotations

import logging
import threading

from scheduler.schedule import Schedule
from swarm.control.messages import ScheduleNotice
from swarm.events import event
from swarm.wire import WireError

logger = logging.getLogger(__name__)

Found = tuple[Schedule, Schedule | None]
"""A schedule, and the epoch it bridges to (`ScheduleMsg.bridge`) or None."""
MAX_CARRIED = 8
"""Epochs kept until taken (epochs come seconds apart at most; the pipeline's thread looks between operations)."""


class CarriedEpochs:
    """What the notices carried and nobody took yet, oldest first (any thread)."""

    def __init__(self) -> None:
        self._found: list[Found] = []
        self._lock = threading.Lock()

    def offer(self, sender: str, notice: ScheduleNotice) -> None:
        """Keep the epoch `notice` (from the scheduler `sender`) carries, if any; one malformed is logged and
        dropped (the notice still has the DHT read)."""
        try:
            msg = notice.carried()
            found = (msg.to_schedule(), msg.to_bridge()) if msg is not None else None
        except WireError as e:
            logger.warning("ignored the schedule carried by a notice from %s: %s", sender, e,
                           extra=event("ignored_control", sender=sender, kind="ScheduleNotice", why=str(e)))
            return
        if found is not None:
            with self._lock:
                self._found = [*self._found[-MAX_CARRIED + 1:], found]

    def take(self) -> list[Found]:
        """Every epoch kept, oldest first; they are kept no more."""
        with self._lock:
            found, self._found = self._found, []
        return found
