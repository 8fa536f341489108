"""What makes a run's DHT record valid, checked by readers and by the storage of every DHT node.

A record of run ``R`` lives under ``skippipe/R/{run,peer,schedule}`` with a subkey that is its author's peer id, and
its value is a :class:`~swarm.wire.SignedRecord`: signed by that peer id's key (RSA as `swarm.net.identity` accepts
it) over the kind, run, subkey, expiry and body; the body decodes under its kind's strict schema and speaks for its
author only (a peer record of the subkey's peer, a run spec naming it coordinator); the signed expiry
is the DHT expiry (no replay can outlive what its author signed) and within its kind's lifetime limit.

`open_record` applies the checks for a reader. `RunRecordValidator` applies the same ones inside hivemind's DHT
(in the manner of its ``RSASignatureValidator``), so that every honest node refuses to store or relay a foreign
subkey, a plain value over the subkeys or a malformed record: a forged value can no longer hide honest records,
nor replace the peer dictionary and get the next honest heartbeat refused. Once the node knows who the run admits
(`RecordWriters`), it also refuses the records of anyone else, so that strangers cannot swell a key's dictionary
past what a DHT reply may carry. Both go through `OpenedRecords`, which checks a record's signature and body once
and only its expiry and author at later reads.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.constants import (
    MAX_PEER_RECORD_LIFETIME,
    MAX_RECORD_BYTES,
    MAX_RECORD_LIFETIME,
    MAX_SCHEDULE_BYTES,
)
from swarm.control.record_writers import RecordWriters
from swarm.net.identity import IdentityError, peer_id_from_public_key, verify
from swarm.wire import PeerRecord, RunSpec, ScheduleMsg, SignedRecord, WireError

logger = logging.getLogger(__name__)

RECORD_KINDS = {"run": RunSpec, "peer": PeerRecord, "schedule": ScheduleMsg}
"""The kinds of record a run keeps in the DHT, and the schema of each one's body."""
LIFETIME_LIMITS = {"run": MAX_RECORD_LIFETIME, "peer": MAX_PEER_RECORD_LIFETIME, "schedule": MAX_RECORD_LIFETIME}
"""How far in the future a record of each kind may expire: a peer record lives a few heartbeats."""
CLOCK_SLACK = 30.0
"""Seconds of clock difference between two nodes tolerated on expiries."""


def record_key(run_id: str, kind: str) -> str:
    """The DHT key of a run's records of one kind ("run", "peer", "schedule")."""
    return f"skippipe/{run_id}/{kind}"


def max_record_bytes(kind: str) -> int:
    return MAX_SCHEDULE_BYTES if kind == "schedule" else MAX_RECORD_BYTES


def open_record(kind: str, run_id: str, subkey: Any, value: Any, now: float, *,
                signers: Collection[str] | None = None, dht_expiry: float | None = None,
                writers: RecordWriters | None = None) -> tuple[Any, float]:
    """The decoded body of one stored record and its signed expiry; raises :class:`WireError` saying why not.

    :param signers: if given, only these subkeys are opened: anyone else's record is refused before it is parsed
    :param dht_expiry: the expiry the DHT stores the value with, which must be the signed one
    :param writers: if given, a record whose author the run does not admit is refused before its signature is
      checked (the costliest check: a flood of strangers' records costs a parse and an HMAC each)
    """
    body, record = _open(kind, run_id, subkey, value, now, signers=signers, dht_expiry=dht_expiry, writers=writers)
    return body, record.expires


def _open(kind: str, run_id: str, subkey: Any, value: Any, now: float, *, signers: Collection[str] | None,
          dht_expiry: float | None, writers: RecordWriters | None) -> tuple[Any, SignedRecord]:
    """`open_record`'s checks; the decoded body and the envelope it came in."""
    if type(subkey) is not str:
        raise WireError("subkey is not a peer id")
    if signers is not None and subkey not in signers:
        raise WireError("not signed by a peer trusted for this kind of record")
    if type(value) is not bytes:
        raise WireError(f"value is {type(value).__name__}, not bytes")
    max_bytes = max_record_bytes(kind)
    record = SignedRecord.from_msgpack(value, max_bytes=max_bytes)
    if record.kind != kind:
        raise WireError(f"record of kind {record.kind!r} under the {kind} key")
    try:
        signer = peer_id_from_public_key(record.public_key)
    except IdentityError as e:
        raise WireError(f"bad public key: {e}") from None
    if signer != subkey:
        raise WireError(f"signed by {signer}, not by the subkey's owner")
    check_writer(writers, subkey, record.proof)
    check_expiry(kind, record.expires, now, dht_expiry)
    if not verify(record.public_key, SignedRecord.signed_bytes(kind, run_id, subkey, record.expires, record.body),
                  record.signature):
        raise WireError("bad signature")
    cls = RECORD_KINDS[kind]
    body = cls.from_msgpack(record.body, max_bytes=max_bytes) if kind == "schedule" else cls.from_msgpack(record.body)
    if kind == "peer" and body.peer_id != subkey:
        raise WireError(f"a record for {body.peer_id}")
    if kind == "run" and (body.coordinator != subkey or body.run_id != run_id):
        raise WireError(f"a run spec naming coordinator {body.coordinator} of run {body.run_id!r}")
    return body, record


def check_writer(writers: RecordWriters | None, signer: str, proof: bytes) -> None:
    """Raise :class:`WireError` if `writers` (when known) do not include `signer` with `proof`."""
    why = writers.refusal(signer, proof) if writers is not None else None
    if why is not None:
        raise WireError(f"not a writer of this run: {why}")


def check_expiry(kind: str, expires: float, now: float, dht_expiry: float | None = None) -> None:
    """Raise :class:`WireError` unless a record of `kind` signed to expire at `expires` is alive at `now`, not
    longer-lived than its kind allows, and (if given) stored with that same expiry: the checks that change with
    time, so a record opened once must pass them again at every later read."""
    if dht_expiry is not None and dht_expiry != expires:
        raise WireError("stored with another expiry than the one its author signed")
    if expires <= now:
        raise WireError(f"expired {now - expires:.1f}s ago (replayed?)")
    if expires > now + LIFETIME_LIMITS[kind] + CLOCK_SLACK:
        raise WireError("expiry too far in the future")


class OpenedRecords:
    """`open_record` that remembers what it opened, so a record read again costs a hash, not a signature check.

    Every DHT read returns a whole dictionary of records (one per peer), and every node on a lookup's way checks
    all of them again: in a 20-peer swarm the DHT processes spent ~0.35 of the machine's 2 cores re-verifying the
    same RSA signatures and re-parsing the same bodies. What `open_record` decides depends only on the record's
    bytes, its kind, run and subkey, except its expiry checks; so a hit re-applies only those (`check_expiry`) and
    the author filter (`signers`), and returns the body decoded the first time. Bodies are frozen dataclasses and are
    shared between the reads that return them: callers must not mutate their dict fields. Only records that opened
    are kept (a forged or junk one takes the full check every time, as before), the newest `max_entries` and at
    most `max_bytes` of record bytes; records larger than a quarter of that are opened without being kept. Only the
    newest version of each peer's record is read again, so 256 entries hold several heartbeats of a 40-peer swarm;
    a peer's tree holds two memos (its DHT process and itself), so they are kept small.
    """

    def __init__(self, *, max_entries: int = 256, max_bytes: int = 4 * 1024 * 1024) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be positive")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._opened: OrderedDict[tuple[str, str, str, bytes], tuple[Any, float, bytes, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def open(self, kind: str, run_id: str, subkey: Any, value: Any, now: float, *,
             signers: Collection[str] | None = None, dht_expiry: float | None = None,
             writers: RecordWriters | None = None) -> tuple[Any, float]:
        """What ``open_record(kind, run_id, subkey, value, now, ...)`` returns or raises."""
        if type(subkey) is not str or type(value) is not bytes or len(value) > max_record_bytes(kind) \
                or kind not in RECORD_KINDS:
            return open_record(kind, run_id, subkey, value, now, signers=signers, dht_expiry=dht_expiry,
                               writers=writers)
        if signers is not None and subkey not in signers:
            raise WireError("not signed by a peer trusted for this kind of record")
        key = (kind, run_id, subkey, hashlib.blake2b(value, digest_size=32).digest())
        with self._lock:
            found = self._opened.get(key)
            if found is not None:
                self._opened.move_to_end(key)
        if found is not None:
            body, expires, proof, _ = found
            check_writer(writers, subkey, proof)
            check_expiry(kind, expires, now, dht_expiry)
            self.hits += 1
            return body, expires
        self.misses += 1
        body, record = _open(kind, run_id, subkey, value, now, signers=signers, dht_expiry=dht_expiry,
                             writers=writers)
        if 4 * len(value) <= self.max_bytes:
            self._keep(key, (body, record.expires, record.proof, len(value)))
        return body, record.expires

    def __len__(self) -> int:
        return len(self._opened)

    def _keep(self, key: tuple[str, str, str, bytes], entry: tuple[Any, float, bytes, int]) -> None:
        """Remember `entry`: the body, signed expiry, proof and byte size of the record `key` names."""
        with self._lock:
            if key in self._opened:
                return
            self._opened[key] = entry
            self._bytes += entry[-1]
            while len(self._opened) > self.max_entries or self._bytes > self.max_bytes:
                _, (*_, dropped) = self._opened.popitem(last=False)
                self._bytes -= dropped


class RunRecordValidator(RecordValidatorBase):
    """Refuses, in a DHT node's storage and in what it reads from others, any record of run `run_id` that
    `open_record` would refuse, and, once the node knows who the run admits (`writers`), any record of an author it
    does not admit; records under other keys (hivemind's averaging, other runs) pass untouched.

    It runs inside the DHT's own process, so it logs (at debug level: a flood of junk must not flood the log) and
    never raises. A node that learns the writers after it started (a peer reads the run spec through its DHT) hands
    them over with `restrict_writers`.
    """

    def __init__(self, run_id: str, writers: RecordWriters | None = None) -> None:
        if writers is not None and writers.run != run_id:
            raise ValueError(f"the writers of run {writers.run!r} cannot guard run {run_id!r}")
        self.run_id, self.writers = run_id, writers
        self.opened = OpenedRecords()
        self._kinds = {DHTID.generate(source=record_key(run_id, kind)).to_bytes(): kind for kind in RECORD_KINDS}

    def validate(self, record: DHTRecord) -> bool:
        kind = self._kinds.get(record.key)
        if kind is None:
            return True
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            if subkey is None:
                raise WireError("a plain value where each peer's record has a subkey of its own")
            value = MSGPackSerializer.loads(record.value)
            self.opened.open(kind, self.run_id, subkey, value, get_dht_time(), dht_expiry=record.expiration_time,
                             writers=self.writers)
        except Exception as e:  # malformed msgpack raises several types; all mean the same: refused
            logger.debug("refused a %s record of run %s: %s", kind, self.run_id, e)
            return False
        return True

    def merge_with(self, other: RecordValidatorBase) -> bool:
        """Another validator of the same run is this one; the writers it knows replace those this one knew."""
        if not isinstance(other, RunRecordValidator) or other.run_id != self.run_id:
            return False
        if other.writers is not None:
            self.writers = other.writers
        return True


async def restrict_writers(_dht: Any, node: DHTNode, *, writers: RecordWriters) -> int:
    """In a DHT's process (``DHT.run_coroutine``): from now on the node stores and relays only the records of
    run ``writers.run`` that `writers` admits, and drops those it holds already (stored or cached) that they do
    not; returns how many it dropped. Without the purge, what a stranger stored before the node knew the run would
    be served (and refused, whole dictionary at once, by every node that knows) until it expired."""
    validator = node.protocol.record_validator
    validator.extend([RunRecordValidator(writers.run, writers)])  # merged into the node's own (`merge_with`)
    dropped = 0
    for kind in RECORD_KINDS:
        key = DHTID.generate(source=record_key(writers.run, kind))
        for storage in (node.protocol.storage, node.protocol.cache):
            found = storage.get(key)
            if found is None or not isinstance(found.value, DictionaryDHTValue):
                continue
            for subkey, item in list(found.value.items()):
                record = DHTRecord(key.to_bytes(), MSGPackSerializer.dumps(subkey), item.value, item.expiration_time)
                if not validator.validate(record):
                    del found.value[subkey]
                    dropped += 1
    if dropped:
        logger.info("dropped %d stored records of run %s whose authors it does not admit", dropped, writers.run)
    return dropped
