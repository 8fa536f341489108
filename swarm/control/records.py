"""Signed records of a run in the hivemind DHT: the run spec, one record per peer, the current schedule.

Layout, for run ``R`` (each record under a subkey named after its author's peer id):
- ``skippipe/R/run``: the run spec, signed by the coordinator;
- ``skippipe/R/peers``: one :class:`~swarm.wire.PeerRecord` per peer, signed by that peer, with an absolute expiry
  a :class:`Heartbeat` keeps pushing forward; a peer that stops beating drops out when it expires;
- ``skippipe/R/schedule``: the current :class:`~swarm.wire.ScheduleMsg`, signed by the scheduler, for late joiners.

Anyone can write anything to a DHT, so readers trust nothing: a record must decode under the strict schema, be
signed by the key whose peer id is its subkey (and, for peer records, its ``peer_id``), and its signed expiry must
be in the future. Whatever fails is ignored with a warning naming the subkey. Public methods are synchronous and
take an explicit ``timeout``; each has a private async twin for callers already inside an event loop. A store that
does not finish in time returns False; a read that does not raises TimeoutError.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from hivemind import DHT
from hivemind.utils import get_dht_time

from swarm.constants import (
    DHT_TIMEOUT,
    HEARTBEAT_PERIOD,
    PEER_RECORD_TTL,
    RUN_SPEC_TTL,
    SCHEDULE_TTL,
)
from swarm.control.record_validator import LIFETIME_LIMITS, OpenedRecords, record_key
from swarm.events import event
from swarm.net.identity import Identity
from swarm.wire import PeerRecord, PeerState, RunSpec, ScheduleMsg, SignedRecord, WireError

logger = logging.getLogger(__name__)

class SwarmRecords:
    """Publish and read one run's signed records through a running :class:`hivemind.DHT`.

    :param dht: a started DHT (ideally created with ``identity_path`` = this peer's key file, so the DHT's peer id
      is the one that signs)
    :param identity: this peer's key, used to sign what it publishes
    :param run_id: the run these records belong to
    :param proof: this peer's proof of the run's join token, carried by every record it stores so that nodes that
      know the run store them (`swarm.control.record_writers`); b"" where it has none
    """

    def __init__(self, dht: DHT, identity: Identity, run_id: str, *, proof: bytes = b""):
        self.dht, self.identity, self.run_id, self.proof = dht, identity, run_id, proof
        self._last_expiry: dict[str, float] = {}
        self._lock = threading.Lock()
        self._opened = OpenedRecords()  # a record read again is not verified again

    # ---- run spec ------------------------------------------------------------------------------------------------
    def publish_run_spec(self, spec: RunSpec, *, ttl: float = RUN_SPEC_TTL, timeout: float = DHT_TIMEOUT) -> bool:
        """Store the run spec, signed by this peer (which must be ``spec.coordinator``); True if stored."""
        if spec.coordinator != self.identity.peer_id or spec.run_id != self.run_id:
            raise ValueError("the run spec must name this peer as coordinator and this run's id")
        return self._store("run", spec.to_msgpack(), ttl, timeout)

    def fetch_run_spec(self, *, coordinator: str, timeout: float = DHT_TIMEOUT) -> RunSpec | None:
        """The run spec signed by ``coordinator``, or None. Nobody else's is even parsed: a joiner names the
        coordinator it trusts (the peer id of its bootstrap address, or one it was told), never the newest spec."""
        specs = self._fetch("run", timeout, signers={coordinator})
        spec = specs[coordinator][0] if coordinator in specs else None
        if spec is not None and (spec.coordinator != coordinator or spec.run_id != self.run_id):
            logger.warning("run spec signed by %s names coordinator %s, run %s: ignored", coordinator,
                           spec.coordinator, spec.run_id)
            return None
        return spec

    # ---- peer records --------------------------------------------------------------------------------------------
    def publish_peer(self, record: PeerRecord, *, ttl: float = PEER_RECORD_TTL, timeout: float = DHT_TIMEOUT) -> bool:
        """Store this peer's record until now + ``ttl``; True if stored."""
        if record.peer_id != self.identity.peer_id:
            raise ValueError(f"record of {record.peer_id} cannot be published by {self.identity.peer_id}")
        return self._store("peer", record.to_msgpack(), ttl, timeout)

    def fetch_peers(self, *, timeout: float = DHT_TIMEOUT) -> dict[str, PeerRecord]:
        """Every live, validly signed peer record of the run, by peer id."""
        return {p: record for p, (record, _) in self._pick_peers(self._fetch("peer", timeout)).items()}

    def fetch_peers_with_age(self, ttl: float, *, timeout: float = DHT_TIMEOUT) -> dict[str, tuple[PeerRecord, float]]:
        """Every live peer record with its age: seconds since it was published (its signed expiry less ``ttl``, the
        lifetime its peer gives it), which says how overdue the peer's next heartbeat is."""
        now = get_dht_time()
        return {p: (record, now - (expires - ttl)) for p, (record, expires)
                in self._pick_peers(self._fetch("peer", timeout)).items()}

    @staticmethod
    def _pick_peers(records: dict[str, tuple[Any, float]]) -> dict[str, tuple[PeerRecord, float]]:
        out = {}
        for signer, (record, expires) in records.items():
            if record.peer_id != signer:
                logger.warning("peer record for %s signed by %s: ignored", record.peer_id, signer,
                               extra=event("ignored_record", signer=signer, kind="peer",
                                           why=f"a record for {record.peer_id}"))
            else:
                out[signer] = (record, expires)
        return out

    def start_heartbeat(self, make_record: Callable[[], PeerRecord], *, period: float = HEARTBEAT_PERIOD,
                        ttl: float = PEER_RECORD_TTL) -> Heartbeat:
        """Publish ``make_record()`` now and every ``period`` seconds from a background thread."""
        heartbeat = Heartbeat(self, make_record, period=period, ttl=ttl)
        heartbeat.start()
        return heartbeat

    # ---- schedule ------------------------------------------------------------------------------------------------
    def publish_schedule(self, msg: ScheduleMsg, *, ttl: float = SCHEDULE_TTL, timeout: float = DHT_TIMEOUT) -> bool:
        """Store a schedule epoch signed by this peer, for late joiners; True if stored."""
        return self._store("schedule", msg.to_msgpack(), ttl, timeout)

    def fetch_schedule(self, *, signers: Collection[str], timeout: float = DHT_TIMEOUT) -> ScheduleMsg | None:
        """The newest schedule epoch signed by one of ``signers`` (the coordinator / elected scheduler), or None."""
        return self._pick_schedule(self._fetch("schedule", timeout, signers=signers))

    async def _fetch_schedule(self, *, signers: Collection[str], timeout: float = DHT_TIMEOUT) -> ScheduleMsg | None:
        return self._pick_schedule(await self._fetch_async("schedule", timeout, signers=signers))

    @staticmethod
    def _pick_schedule(msgs: dict[str, tuple[Any, float]]) -> ScheduleMsg | None:
        return max((msg for msg, _ in msgs.values()), key=lambda m: m.epoch, default=None)

    # ---- storage ---------------------------------------------------------------------------------------------------
    def _envelope(self, kind: str, body: bytes, ttl: float) -> tuple[bytes, float]:
        if not 0 < ttl <= LIFETIME_LIMITS[kind]:
            raise ValueError(f"a {kind} record's ttl must be in (0, {LIFETIME_LIMITS[kind]}] seconds, got {ttl}")
        with self._lock:  # the DHT refuses a value that expires before the one it holds: never go backwards
            expires = max(get_dht_time() + ttl, self._last_expiry.get(kind, 0.0) + 1e-3)
            self._last_expiry[kind] = expires
        subkey = self.identity.peer_id
        signature = self.identity.sign(SignedRecord.signed_bytes(kind, self.run_id, subkey, expires, body))
        record = SignedRecord(kind=kind, body=body, expires=expires, public_key=self.identity.public_key,
                              signature=signature, proof=self.proof)
        return record.to_msgpack(), expires

    def _store(self, kind: str, body: bytes, ttl: float, timeout: float) -> bool:
        """True once the record is stored, False if that is not known within `timeout` (twice: the store, then the
        read-back); never raises for a slow DHT, whose callers (the scheduler publishing an epoch) must go on. hivemind
        reports the answer of the last replica it asked, which a single hostile replica can make False; so a False
        is checked by reading the record back from the DHT."""
        value, expires = self._envelope(kind, body, ttl)
        key = record_key(self.run_id, kind)
        future = self.dht.store(key, value, expiration_time=expires, subkey=self.identity.peer_id,
                                return_future=True)
        try:
            if future.result(timeout=timeout):
                return True
        except TimeoutError:
            logger.warning("storing %s took over %.1f s: reading it back", key, timeout,
                           extra=event("record_store_slow", kind=kind, seconds=timeout))
        try:
            found = self.dht.get(key, latest=True, return_future=True).result(timeout=timeout)
        except TimeoutError:
            logger.warning("reading %s back took over %.1f s: not known to be stored", key, timeout)
            return False
        item = found.value.get(self.identity.peer_id) if found is not None and isinstance(found.value, dict) else None
        return item is not None and item.value == value

    async def _store_async(self, kind: str, body: bytes, ttl: float, timeout: float) -> bool:
        value, expires = self._envelope(kind, body, ttl)
        future = self.dht.store(record_key(self.run_id, kind), value, expiration_time=expires,
                                subkey=self.identity.peer_id, return_future=True)
        return bool(await asyncio.wait_for(future, timeout))

    def _fetch(self, kind: str, timeout: float, *, signers: Collection[str] | None = None
               ) -> dict[str, tuple[Any, float]]:
        future = self.dht.get(record_key(self.run_id, kind), latest=True, return_future=True)
        return self._validate(kind, future.result(timeout=timeout), signers)

    async def _fetch_async(self, kind: str, timeout: float, *, signers: Collection[str] | None = None
                           ) -> dict[str, tuple[Any, float]]:
        future = self.dht.get(record_key(self.run_id, kind), latest=True, return_future=True)
        return self._validate(kind, await asyncio.wait_for(future, timeout), signers)

    def _validate(self, kind: str, found: Any, signers: Collection[str] | None) -> dict[str, tuple[Any, float]]:
        """Signer peer id -> (decoded record, signed expiry) for every valid entry (of `signers` only, if given);
        the rest logged and dropped. Other signers' records are dropped before anything of them is parsed."""
        if found is None:
            return {}
        key = record_key(self.run_id, kind)
        if not isinstance(found.value, dict):
            logger.warning("%s holds a plain value, not subkeys: ignored", key)
            return {}
        now, out = get_dht_time(), {}
        for subkey, item in found.value.items():
            try:
                out[subkey] = self._opened.open(kind, self.run_id, subkey, item.value, now, signers=signers)
            except WireError as e:
                logger.warning("%s[%.60r]: %s: ignored", key, subkey, e,
                               extra=event("ignored_record", signer=str(subkey)[:60], kind=kind, why=str(e)))
        return out


class Heartbeat:
    """Refreshes a peer's record every ``period`` seconds; on :meth:`stop` announces that the peer leaves.

    Beats keep their cadence: each starts one period after the previous one started, however long its store took
    (a store may take up to a period), so a slow DHT does not age the record past what readers expect. A failed
    refresh is logged and retried at the next beat: the record's ttl (several periods) absorbs a few.
    """

    def __init__(self, records: SwarmRecords, make_record: Callable[[], PeerRecord], *,
                 period: float = HEARTBEAT_PERIOD, ttl: float = PEER_RECORD_TTL):
        if not 0 < period < ttl:
            raise ValueError(f"heartbeat period ({period}) must be positive and shorter than the ttl ({ttl})")
        self.records, self.make_record, self.period, self.ttl = records, make_record, period, ttl
        self.beats = 0
        """Successful refreshes so far."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skippipe-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if self.records.publish_peer(self.make_record(), ttl=self.ttl, timeout=min(self.period, DHT_TIMEOUT)):
                    self.beats += 1
                else:
                    logger.warning("heartbeat: the DHT did not store this peer's record")
            except Exception as e:  # keep beating: one failed store must not drop the peer from the swarm
                logger.warning("heartbeat failed: %s: %s", type(e).__name__, e)
            self._stop.wait(max(0.0, started + self.period - time.monotonic()))

    def beat_now(self, timeout: float = DHT_TIMEOUT) -> bool:
        """Publish the record now, from the calling thread (a change of state the scheduler should see at once)."""
        return self.records.publish_peer(self.make_record(), ttl=self.ttl, timeout=timeout)

    def stop(self, *, leave: bool = True, timeout: float = DHT_TIMEOUT) -> None:
        """Stop beating; if ``leave``, publish the record once more with state LEAVING (it then expires unrefreshed).

        The DHT keeps the value with the latest expiry, so a 'leaving' record cannot expire sooner than the last
        heartbeat's; readers see the state and stop routing to the peer at once.
        """
        self._stop.set()
        self._thread.join(timeout=timeout)
        if leave:
            try:
                record = dataclasses.replace(self.make_record(), state=PeerState.LEAVING)
                self.records.publish_peer(record, ttl=self.ttl, timeout=timeout)
            except Exception as e:
                logger.warning("could not announce leaving: %s: %s", type(e).__name__, e)
