"""`GoneNotices`: which peers the scheduler told the run are gone, and under which epoch.

The peers detour around a peer they are told is gone, and the iterations run under the epoch it was told under (or
an older one) commit without it: it is left out of them (`left_out`) until an epoch without it, or one that places it
again, runs. With re-plans made off the scheduler's loop, more than one iteration may run under that epoch after the
notice (the one in progress, then those that start while the new epoch is planned). Each peer is told once per epoch.
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler.schedule import Schedule
from swarm.control.messages import Gone


class GoneNotices:
    """Peer -> the newest epoch when the run was told it is gone."""

    def __init__(self) -> None:
        self._under: dict[str, int] = {}

    def tell(self, gone: Collection[str], latest: Schedule, iteration: int) -> list[Gone]:
        """The notice that `gone` are gone, `latest` being the newest epoch and `iteration` in progress: those not
        told so under `latest` yet (none if none is new)."""
        new = [p for p in gone if self._under.get(p, -1) < latest.epoch]
        self._under.update(dict.fromkeys(new, latest.epoch))
        return [Gone(peers=tuple(new), iteration=iteration, epoch=latest.epoch)] if new else []

    def told(self, peer: str, latest: Schedule) -> bool:
        """Whether the run was told `peer` is gone under `latest`, the newest epoch, which still places it (its
        re-plan is under way): it is planned around already, and reports about it are no news."""
        return self._under.get(peer, -1) >= latest.epoch

    def left_out(self, running: Schedule) -> set[str]:
        """The peers `running` places that a commit of an iteration it runs leaves out: told gone under it or a newer
        epoch."""
        return {p for p in running.placement if self._under.get(p, -1) >= running.epoch}

    def running(self, epoch: int) -> None:
        """`epoch` runs the iteration in progress: notices under older epochs are forgotten."""
        self._under = {p: e for p, e in self._under.items() if e >= epoch}
