"""What makes a run's DHT record valid, checked by readers and by the storage of every DHT node.

A record of run ``R`` lives under ``skippipe/R/{run,peer,schedule}`` with a subkey that is its author's peer id, and
its value is a :class:`~swarm.wire.SignedRecord`: signed by that peer id's key (RSA as `swarm.net.identity` accepts
it) over the kind, run, subkey, expiry and body; the body decodes under its kind's strict schema and speaks for its
author only (a peer record of the subkey's peer, a run spec naming it coordinator); the signed expiry
is the DHT expiry (no replay can outlive what its author signed) and within its kind's lifetime limit.

`open_record` applies the checks for a reader. `RunRecordValidator` applies the same ones inside hivemind's DHT
(in the manner of its ``RSASignatureValidator``), so that every honest node refuses to store or relay a foreign
subkey, a plain value over the subkeys or a malformed record: a forged value can no longer hide honest records,
nor replace the peer dictionary and get the next honest heartbeat refused.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.constants import (
    MAX_PEER_RECORD_LIFETIME,
    MAX_RECORD_BYTES,
    MAX_RECORD_LIFETIME,
    MAX_SCHEDULE_BYTES,
)
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
                signers: Collection[str] | None = None, dht_expiry: float | None = None) -> tuple[Any, float]:
    """The decoded body of one stored record and its signed expiry; raises :class:`WireError` saying why not.

    :param signers: if given, only these subkeys are opened: anyone else's record is refused before it is parsed
    :param dht_expiry: the expiry the DHT stores the value with, which must be the signed one
    """
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
    if dht_expiry is not None and dht_expiry != record.expires:
        raise WireError("stored with another expiry than the one its author signed")
    if record.expires <= now:
        raise WireError(f"expired {now - record.expires:.1f}s ago (replayed?)")
    if record.expires > now + LIFETIME_LIMITS[kind] + CLOCK_SLACK:
        raise WireError("expiry too far in the future")
    if not verify(record.public_key, SignedRecord.signed_bytes(kind, run_id, subkey, record.expires, record.body),
                  record.signature):
        raise WireError("bad signature")
    cls = RECORD_KINDS[kind]
    body = cls.from_msgpack(record.body, max_bytes=max_bytes) if kind == "schedule" else cls.from_msgpack(record.body)
    if kind == "peer" and body.peer_id != subkey:
        raise WireError(f"a record for {body.peer_id}")
    if kind == "run" and (body.coordinator != subkey or body.run_id != run_id):
        raise WireError(f"a run spec naming coordinator {body.coordinator} of run {body.run_id!r}")
    return body, record.expires


class RunRecordValidator(RecordValidatorBase):
    """Refuses, in a DHT node's storage and in what it reads from others, any record of run `run_id` that
    `open_record` would refuse; records under other keys (hivemind's averaging, other runs) pass untouched.

    It runs inside the DHT's own process, so it logs (at debug level: a flood of junk must not flood the log) and
    never raises.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
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
            open_record(kind, self.run_id, subkey, value, get_dht_time(), dht_expiry=record.expiration_time)
        except Exception as e:  # malformed msgpack raises several types; all mean the same: refused
            logger.debug("refused a %s record of run %s: %s", kind, self.run_id, e)
            return False
        return True

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, RunRecordValidator) and other.run_id == self.run_id
