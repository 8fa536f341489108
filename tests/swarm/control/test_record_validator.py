"""What makes a run's DHT record valid, and the memo that opens each record once (`OpenedRecords`): a record read
again is served without a second signature check, but still expires, still answers to the author filter and the
stored expiry, and a changed byte is a new record that takes every check."""

from __future__ import annotations

import dataclasses

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.control.membership import token_proof
from swarm.control.record_validator import OpenedRecords, RunRecordValidator, open_record, record_key
from swarm.control.record_writers import RecordWriters
from swarm.net.identity import ensure_identity, load_identity
from swarm.wire import PeerRecord, PeerState, SignedRecord, WireError

RUN = "memo"
NOW = 1_000_000.0


@pytest.fixture(scope="module")
def alice(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("keys") / "alice.key")
    ensure_identity(path)
    return load_identity(path)


def signed_peer_record(identity, *, expires: float = NOW + 30, slots: int = 3, proof: bytes = b"") -> bytes:
    body = PeerRecord(peer_id=identity.peer_id, stage=1, seconds_per_layer=0.01, memory_slots=slots,
                      state=PeerState.ONLINE).to_msgpack()
    signature = identity.sign(SignedRecord.signed_bytes("peer", RUN, identity.peer_id, expires, body))
    return SignedRecord(kind="peer", body=body, expires=expires, public_key=identity.public_key,
                        signature=signature, proof=proof).to_msgpack()


def stored(identity, value: bytes, expires: float) -> DHTRecord:
    """`value` as a DHT node's storage hands it to its validator: under the run's peer key and its author's subkey."""
    return DHTRecord(DHTID.generate(source=record_key(RUN, "peer")).to_bytes(),
                     MSGPackSerializer.dumps(identity.peer_id), MSGPackSerializer.dumps(value), expires)


def test_a_record_read_again_is_served_from_the_memo_with_the_same_body(alice):
    opened = OpenedRecords()
    value = signed_peer_record(alice)
    first = opened.open("peer", RUN, alice.peer_id, value, NOW)
    again = opened.open("peer", RUN, alice.peer_id, value, NOW + 1)
    assert first == again == open_record("peer", RUN, alice.peer_id, value, NOW)
    assert first[0].peer_id == alice.peer_id and first[0].memory_slots == 3
    assert (opened.misses, opened.hits) == (1, 1)


def test_a_remembered_record_still_expires_and_still_answers_to_signers_and_stored_expiry(alice):
    opened = OpenedRecords()
    value = signed_peer_record(alice, expires=NOW + 30)
    opened.open("peer", RUN, alice.peer_id, value, NOW)
    with pytest.raises(WireError, match="expired"):
        opened.open("peer", RUN, alice.peer_id, value, NOW + 31)
    with pytest.raises(WireError, match="not signed by a peer trusted"):
        opened.open("peer", RUN, alice.peer_id, value, NOW, signers={"QmSomeoneElse"})
    with pytest.raises(WireError, match="another expiry"):
        opened.open("peer", RUN, alice.peer_id, value, NOW, dht_expiry=NOW + 3600)
    with pytest.raises(WireError, match="too far in the future"):  # a clock far behind the record's
        opened.open("peer", RUN, alice.peer_id, value, NOW - 100_000)
    assert opened.open("peer", RUN, alice.peer_id, value, NOW, dht_expiry=NOW + 30)[1] == NOW + 30
    assert opened.misses == 1  # every refusal above came from the memo's own checks, not a second open


def test_a_changed_byte_another_subkey_or_run_takes_every_check(alice, tmp_path):
    opened = OpenedRecords()
    value = signed_peer_record(alice)
    opened.open("peer", RUN, alice.peer_id, value, NOW)
    record = SignedRecord.from_msgpack(value)
    other_body = PeerRecord(peer_id=alice.peer_id, stage=1, seconds_per_layer=0.01, memory_slots=4).to_msgpack()
    tampered = dataclasses.replace(record, body=other_body).to_msgpack()
    with pytest.raises(WireError, match="bad signature"):
        opened.open("peer", RUN, alice.peer_id, tampered, NOW)
    ensure_identity(str(tmp_path / "mallory.key"))
    mallory = load_identity(str(tmp_path / "mallory.key"))
    with pytest.raises(WireError, match="not by the subkey's owner"):  # the same bytes under a victim's subkey
        opened.open("peer", RUN, mallory.peer_id, value, NOW)
    with pytest.raises(WireError, match="bad signature"):  # replayed into another run
        opened.open("peer", "other-run", alice.peer_id, value, NOW)
    for junk in (b"\xc1 not msgpack", 12345):
        with pytest.raises(WireError):
            opened.open("peer", RUN, alice.peer_id, junk, NOW)
    assert len(opened) == 1  # nothing that failed was remembered


def test_the_memo_keeps_the_newest_records_within_its_bounds(alice):
    opened = OpenedRecords(max_entries=3)
    values = [signed_peer_record(alice, expires=NOW + 10 + i) for i in range(5)]
    for value in values:
        opened.open("peer", RUN, alice.peer_id, value, NOW)
    assert len(opened) == 3
    opened.open("peer", RUN, alice.peer_id, values[-1], NOW)
    assert opened.hits == 1
    opened.open("peer", RUN, alice.peer_id, values[0], NOW)  # evicted: opened again
    assert opened.misses == 6
    small = OpenedRecords(max_bytes=4 * len(values[0]) - 1)  # one record is over a quarter of the budget
    small.open("peer", RUN, alice.peer_id, values[0], NOW)
    assert len(small) == 0
    with pytest.raises(ValueError):
        OpenedRecords(max_entries=0)


def test_a_node_that_learns_the_runs_writers_refuses_strangers_even_those_it_let_in_before(alice, tmp_path):
    """A peer's DHT starts before it has read who the run admits: from then on (`merge_with`, which
    `restrict_writers` goes through) a stranger's record is refused, also one the memo had opened."""
    token = "the-runs-join-token-0123456789"
    ensure_identity(str(tmp_path / "mallory.key"))
    mallory = load_identity(str(tmp_path / "mallory.key"))
    expires = get_dht_time() + 30
    member = stored(alice, signed_peer_record(alice, expires=expires, proof=token_proof(token, alice.peer_id, RUN)),
                    expires)
    stranger = stored(mallory, signed_peer_record(mallory, expires=expires), expires)
    validator = RunRecordValidator(RUN)
    assert validator.validate(member) and validator.validate(stranger)  # not knowing the run, a signature will do
    assert validator.merge_with(RunRecordValidator(RUN, RecordWriters(RUN, "QmCoordinator", token=token)))
    assert validator.validate(member) and not validator.validate(stranger)
    assert validator.opened.misses == 2  # both answered from the memo, which applies the writers too
    assert validator.merge_with(RunRecordValidator(RUN)) and not validator.validate(stranger)  # learnt nothing new
    assert not validator.merge_with(RunRecordValidator("another-run"))
    with pytest.raises(ValueError, match="cannot guard"):
        RunRecordValidator(RUN, RecordWriters("another-run", "QmCoordinator"))
