"""`SwarmObserver`: an onlooker of a run. It joins the DHT as a client and the run's gossip as a listener, with a
throwaway identity, and keeps what it reads: the run spec, every peer's record, the newest schedules and the
progress of committed iterations.

It trusts nothing beyond signatures: the run spec must be signed by the coordinator the caller names (the peer id of
its bootstrap address, as for a joiner), schedules, commits, 'gone' and 'finished' by the coordinator or a successor
the schedule names, peer records by their peer, and iteration reports must come from the epoch's data holders. It
never publishes anything and holds no stage, so the run neither plans with it nor waits for it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any

from hivemind.utils import get_dht_time

from scheduler.schedule import Schedule
from swarm.constants import DHT_TIMEOUT, HEARTBEAT_PERIOD, LOOPBACK_HOST, record_lifetime
from swarm.control.gossip import GossipMessage
from swarm.control.messages import Commit, Done, Finished, Gone, ScheduleNotice, received
from swarm.control.node import Node
from swarm.control.record_writers import RecordWriters
from swarm.monitor.progress import ProgressLog
from swarm.monitor.snapshot import PeerSighting, swarm_snapshot
from swarm.net.identity import ensure_identity
from swarm.run_config import RunConfig
from swarm.wire import RunSpec, WireError

logger = logging.getLogger(__name__)

KEEP_EPOCHS = 8
"""Schedule epochs remembered, to check late reports of an epoch just replaced."""


def stale_after(heartbeat: float) -> float:
    """A peer whose record is older than this is shown stale (it missed two beats), before its record expires."""
    return 2 * heartbeat + 1.0


class SwarmObserver:
    """Watch run `run_id` through `initial_peers`. `start` blocks until the run spec is read (or raises
    TimeoutError), then a background thread re-reads the DHT every `interval` seconds; `snapshot` is safe to call
    from any thread; `stop` leaves and removes the throwaway identity.

    :param coordinator: the peer id whose run spec is trusted
    """

    def __init__(self, initial_peers: Iterable[str], run_id: str, *, coordinator: str, interval: float = 2.0,
                 host: str = LOOPBACK_HOST) -> None:
        self.initial_peers, self.run_id, self.coordinator = tuple(initial_peers), run_id, coordinator
        self.interval = interval
        self._dir = tempfile.mkdtemp(prefix="skippipe-monitor-")
        identity = os.path.join(self._dir, "identity.key")
        ensure_identity(identity)
        self.node = Node(identity, run_id, host=host, on_message=self._on_gossip)
        self.spec: RunSpec | None = None
        self.heartbeat = HEARTBEAT_PERIOD
        """The run's heartbeat period, from its spec: how old a live peer's record may be."""
        self.finished = False
        self.progress = ProgressLog()
        self._sightings: dict[str, PeerSighting] = {}
        self._schedules: dict[int, Schedule] = {}
        self._problems: list[str] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads = 0
        """DHT reads completed (a caller waiting for a fresh view watches it grow)."""

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        records = self.node.start_dht(self.initial_peers, client=True)
        deadline = time.monotonic() + timeout
        while self.spec is None:
            self.spec = records.fetch_run_spec(coordinator=self.coordinator, timeout=DHT_TIMEOUT)
            if self.spec is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no run spec of run {self.run_id!r} signed by {self.coordinator} in the DHT "
                                       f"within {timeout:.0f} s: check --run and the address")
                time.sleep(1.0)
        try:
            self.heartbeat = RunConfig.from_spec(self.spec)[0].heartbeat
        except ValueError as e:  # a spec peers would refuse too; the default period still gives a view
            self._note(f"run spec unreadable: {e}")
        try:  # no token: in a token run it checks the proofs' shape only
            self.node.restrict_writers(RecordWriters.of(self.spec, None))
        except Exception as e:  # strangers' records then show too
            self._note(f"could not tell the DHT who the run admits: {e}")
        self.refresh()
        if self.spec.control_addrs:
            try:
                self.node.start_gossip(bootstrap=self.spec.control_addrs)
            except Exception as e:  # the records alone still make a useful view
                self._note(f"gossip unavailable, no iteration progress: {e}")
        self._thread = threading.Thread(target=self._loop, name="monitor-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=DHT_TIMEOUT + 5)
        self.node.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> SwarmObserver:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- reading ------------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the peer records and the newest schedule now."""
        records = self.node.records
        try:
            found = records.fetch_peers_with_age(record_lifetime(self.heartbeat), timeout=DHT_TIMEOUT)
            msg = records.fetch_schedule(signers=self._issuers(), timeout=DHT_TIMEOUT)
        except Exception as e:  # a DHT hiccup: keep the last view, say so
            self._note(f"DHT read failed: {type(e).__name__}: {e}")
            return
        schedule = None
        if msg is not None:
            try:
                schedule = msg.to_schedule()
            except WireError as e:
                self._note(f"schedule epoch {msg.epoch} unreadable: {e}")
        now = time.time()
        with self._lock:
            for peer, sighting in list(self._sightings.items()):
                if peer not in found and sighting.live:
                    self._sightings[peer] = PeerSighting(sighting.record, sighting.age, sighting.seen_at, False)
            for peer, (record, age) in found.items():
                self._sightings[peer] = PeerSighting(record, max(0.0, age), now, True)
            self._keep(schedule)
            self.reads += 1

    def _keep(self, schedule: Schedule | None) -> None:
        """Keep `schedule` among the newest KEEP_EPOCHS epochs (the lock held)."""
        if schedule is not None and schedule.run_id in ("", self.run_id):
            self._schedules[schedule.epoch] = schedule
            for old in sorted(self._schedules)[:-KEEP_EPOCHS]:
                del self._schedules[old]

    def snapshot(self) -> dict[str, Any]:
        """The current view (`swarm.monitor.snapshot.swarm_snapshot`)."""
        with self._lock:
            schedule = self._newest()
            return swarm_snapshot(run_id=self.run_id, coordinator=self.coordinator, spec=self.spec,
                                  sightings=dict(self._sightings), schedule=schedule,
                                  progress=list(self.progress.lines), finished=self.finished,
                                  stale_after=stale_after(self.heartbeat), dht_now=get_dht_time(),
                                  problems=list(self._problems))

    def wait_for_reads(self, count: int, timeout: float) -> bool:
        """Block until `count` more DHT reads completed (a fresh view); False on timeout."""
        target, deadline = self.reads + count, time.monotonic() + timeout
        while self.reads < target:
            if time.monotonic() > deadline:
                return False
            self._wake.set()
            time.sleep(0.1)
        return True

    # ---- internals ----------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._halt.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._halt.is_set():
                self.refresh()

    def _newest(self) -> Schedule | None:
        return self._schedules[max(self._schedules)] if self._schedules else None

    def _issuers(self) -> set[str]:
        """Who may sign schedules and commits: the coordinator and the successors its newest schedule names."""
        with self._lock:
            schedule = self._newest()
        named = schedule.meta.get("successors", []) if schedule is not None else []
        return {self.coordinator, *(p for p in named if isinstance(p, str))}

    def _note(self, problem: str) -> None:
        logger.warning("%s", problem)
        with self._lock:
            self._problems = (self._problems + [problem])[-10:]

    def _on_gossip(self, msg: GossipMessage) -> None:
        """Gossip thread: reports and commits into the progress log; 'gone', 'finished' and notices noted."""
        try:
            message = received(msg, self.run_id)
        except WireError as e:
            logger.debug("ignored a control message from %s: %s", msg.sender, e)
            return
        if isinstance(message, Done):
            with self._lock:
                schedule = self._schedules.get(message.epoch) or self._newest()
                holders = schedule.data_holders if schedule is not None else ()
                self.progress.add_done(msg.sender, message, holders)
            return
        if msg.sender not in self._issuers():
            return
        if isinstance(message, ScheduleNotice):
            try:
                carried = message.carried()
                with self._lock:
                    self._keep(carried.to_schedule() if carried is not None else None)
            except WireError as e:
                self._note(f"schedule epoch {message.epoch} unreadable: {e}")
            self._wake.set()  # read the records now (and the epoch, if the notice did not carry it)
        elif isinstance(message, Commit):
            with self._lock:
                schedule = self._schedules.get(message.epoch)
                online = sum(s.live for s in self._sightings.values())
                self.progress.add_commit(message, peers_online=online, planned_seconds=schedule and
                                         schedule.predicted_iteration_seconds)
        elif isinstance(message, Finished):
            self.finished = True
        elif isinstance(message, Gone):
            self._wake.set()
