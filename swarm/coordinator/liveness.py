"""`Liveness`: which peers the scheduler takes for alive, from their heartbeat records and the peers' reports.

A peer is live while its signed record was seen within its lifetime (three heartbeats and a grace), it has not
announced that it leaves, and corroborated reports do not show it dead (`UnreachableReports`). One DHT read can
miss a record on a busy swarm, so a record absent from one read does not make a peer gone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from swarm.constants import silent_after
from swarm.coordinator.unreachable_reports import UnreachableReports
from swarm.events import event
from swarm.wire import PeerRecord, PeerState

logger = logging.getLogger(__name__)

class Liveness:
    """The scheduler's view of who is alive. Fed each DHT read (`update`) and each unreachable report.

    :param heartbeat: the run's heartbeat period in seconds
    :param exclude: a peer never counted as a live member (the coordinator's own heartbeat record)
    """

    def __init__(self, heartbeat: float, *, exclude: str | None = None) -> None:
        self.heartbeat = heartbeat
        self.exclude = exclude
        self.records: dict[str, PeerRecord] = {}
        """Every peer's newest record seen (live or not)."""
        self._first_seen: dict[str, float] = {}
        self._last_seen: dict[str, float] = {}
        self._heartbeat_age: dict[str, float] = {}
        self._leaving: set[str] = set()
        self._reports = UnreachableReports(heartbeat)
        self.declared_gone: set[str] = set()
        """Peers taken for gone on reports, before their records expire."""

    def update(self, records: Mapping[str, tuple[PeerRecord, float]], now: float) -> dict[str, PeerRecord]:
        """Take in one DHT read (peer -> (record, seconds since its heartbeat)); returns the live peers."""
        for p, (record, age) in records.items():
            if record.state == PeerState.LEAVING:
                self._leaving.add(p)
            self._first_seen.setdefault(p, now)
            self._last_seen[p] = now
            self.records[p], self._heartbeat_age[p] = record, age
        self._judge(now)
        return self.live(now)

    def live(self, now: float) -> dict[str, PeerRecord]:
        """The live peers as of the last read and the reports since."""
        grace = silent_after(self.heartbeat)
        return {p: r for p, r in self.records.items()
                if p not in self._leaving and p not in self.declared_gone and p != self.exclude
                and now - self._last_seen[p] <= grace}

    def first_seen(self, peer: str) -> float:
        """When `peer`'s record was first seen (infinity if never)."""
        return self._first_seen.get(peer, float("inf"))

    def seen_for(self, peer: str, now: float) -> float:
        """Seconds since `peer`'s record was first seen (0 if never)."""
        return now - self._first_seen.get(peer, now)

    def report_unreachable(self, reporter: str, target: str, now: float) -> None:
        """`reporter` could open no stream to `target`; corroborated, `target` is declared gone."""
        self._reports.report(reporter, target, now)
        self._judge(now)

    def reporters(self, target: str, now: float) -> set[str]:
        """Peers that recently reported `target` unreachable."""
        return self._reports.reporters(target, now)

    def declare_gone(self, peer: str, why: str) -> None:
        """Take `peer` for gone before its record expires (the next DHT read leaves it out)."""
        logger.warning("%s is gone: %s", peer, why, extra=event("declared_gone", peer=peer, why=why))
        self.declared_gone.add(peer)
        self._reports.forget(peer)

    def _judge(self, now: float) -> None:
        """Declare gone the peers that corroborated reports show unreachable; take back those that rejoined."""
        for p in list(self.declared_gone):
            record = self.records.get(p)
            if record is not None and record.state == PeerState.JOINING:  # alive after all: it asks to be placed
                logger.info("%s, declared gone, asks to be placed again", p)
                self.declared_gone.discard(p)
                self._reports.forget(p)
        for p, why in self._reports.gone(self._heartbeat_age, now).items():
            self.declare_gone(p, why)
