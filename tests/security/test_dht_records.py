"""Attacks on the run's DHT records, made the way a stranger would: with a DHT node of their own, no validators.

Each was shown to work against the unvalidated DHT: junk under the coordinator's subkey with a later expiry hid
the run spec; a plain value replaced the peer dictionary and the next honest heartbeat was refused; a stranger's run
spec with a 7-day expiry was the one joiners took; any RSA key size or exponent was accepted.
"""

from __future__ import annotations

import base64
import logging
import time

import hivemind
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from hivemind.utils import get_dht_time

from swarm.control.node import Node
from swarm.control.records import SwarmRecords, record_key
from swarm.net.dht_shutdown import stop_dht
from swarm.net.identity import IdentityError, ensure_identity, load_identity, peer_id_from_public_key, verify
from swarm.peer.options import trusted_coordinator
from swarm.wire import PeerRecord, PeerState, RunSpec, SignedRecord, pack

RUN = "run-hostile-dht"
pytestmark = pytest.mark.timeout(120)
DAY = 24 * 3600.0
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """The coordinator's node (validating, as every node of a run does) with its run spec and heartbeat stored."""
    key = str(tmp_path_factory.mktemp("coordinator") / "identity.key")
    ensure_identity(key)
    node = Node(key, RUN)
    records = node.start_dht()
    spec = RunSpec(run_id=RUN, model={}, stages=2, skip_ratio=0.0, hyperparameters={}, data={},
                   coordinator=node.peer_id)
    assert records.publish_run_spec(spec)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def attacker(honest, tmp_path_factory):
    """A stranger's DHT node, joined through the coordinator's address, that validates nothing."""
    key = str(tmp_path_factory.mktemp("mallory") / "identity.key")
    ensure_identity(key)
    dht = hivemind.DHT(initial_peers=honest.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                       identity_path=key, start=True)
    try:
        yield dht, SwarmRecords(dht, load_identity(key), RUN)
    finally:
        stop_dht(dht)


def _heartbeat(records: SwarmRecords) -> PeerRecord:
    record = PeerRecord(peer_id=records.identity.peer_id, stage=0, seconds_per_layer=0.01, memory_slots=3,
                        state=PeerState.ONLINE)
    assert records.publish_peer(record, ttl=30)
    return record


def test_junk_under_the_coordinators_subkey_cannot_hide_the_run_spec(honest, attacker):
    dht, _ = attacker
    later = get_dht_time() + 6 * DAY
    dht.store(record_key(RUN, "run"), b"\xc1junk", expiration_time=later, subkey=honest.peer_id)
    dht.store(record_key(RUN, "run"), pack({"kind": "run"}), expiration_time=later + 1, subkey=honest.peer_id)
    spec = honest.records.fetch_run_spec(coordinator=honest.peer_id)
    assert spec is not None and spec.coordinator == honest.peer_id


def test_a_plain_value_cannot_replace_the_peer_records(honest, attacker):
    dht, _ = attacker
    dht.store(record_key(RUN, "peer"), b"plain", expiration_time=get_dht_time() + 6 * DAY)
    record = _heartbeat(honest.records)  # the next honest heartbeat is still stored...
    assert honest.records.fetch_peers()[honest.peer_id] == record  # ...and read


def test_a_strangers_run_spec_is_never_the_one_trusted(honest, attacker):
    _, mallory = attacker
    fake = RunSpec(run_id=RUN, model={}, stages=2, skip_ratio=0.0, hyperparameters={"lr": 1e9},
                   data={"paths": ["/etc/shadow"]}, coordinator=mallory.identity.peer_id)
    mallory.publish_run_spec(fake, ttl=6 * DAY)  # validly signed by its author, expiring much later
    address = honest.visible_maddrs()[0]
    coordinator = trusted_coordinator((address,))
    assert coordinator == honest.peer_id  # a joiner trusts the peer id of the address it was given
    assert honest.records.fetch_run_spec(coordinator=coordinator).hyperparameters == {}
    with pytest.raises(ValueError, match="--coordinator"):
        trusted_coordinator(("/ip4/127.0.0.1/tcp/4000",))


def test_a_foreign_schedule_is_dropped_before_it_is_parsed(honest, attacker, caplog):
    dht, mallory = attacker
    junk = mallory._envelope("schedule", b"\xc1" * 4096, 60)  # validly signed, a body that is not a schedule
    dht.store(record_key(RUN, "schedule"), junk[0], expiration_time=junk[1], subkey=mallory.identity.peer_id)
    found = honest.dht.get(record_key(RUN, "schedule"), latest=True)  # the honest node neither stores nor relays it
    assert found is None or mallory.identity.peer_id not in found.value
    reader = SwarmRecords(dht, mallory.identity, RUN)  # reading from the attacker's own storage, which holds it
    with caplog.at_level(logging.WARNING, logger="swarm.control.records"):
        assert reader.fetch_schedule(signers={honest.peer_id}) is None
    assert "not signed by a peer trusted" in caplog.text and "msgpack" not in caplog.text


def test_weak_or_slow_keys_are_refused(tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                            serialization.NoEncryption())
    path = tmp_path / "rsa1024.key"
    path.write_bytes(b"\x08\x00\x12" + bytes([len(der) & 0x7F | 0x80, len(der) >> 7]) + der)  # libp2p's format
    with pytest.raises(IdentityError, match="1024 bits"):
        load_identity(str(path))
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    signature = base64.b64encode(key.sign(b"record", _PSS, hashes.SHA256()))
    assert not verify(public, b"record", signature)  # a forgeable key signs nothing
    with pytest.raises(IdentityError, match="1024 bits"):
        peer_id_from_public_key(public)
    # a public exponent far above 65537 makes every verification slow: refused before any work
    n = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_numbers().n
    slow = rsa.RSAPublicNumbers(e=(1 << 2000) + 1, n=n).public_key()
    with pytest.raises(IdentityError, match="exponent"):
        peer_id_from_public_key(slow.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))


def test_a_record_replayed_with_a_longer_expiry_is_refused(honest, attacker):
    dht, _ = attacker
    record = _heartbeat(honest.records)
    found = honest.dht.get(record_key(RUN, "peer"), latest=True)
    value = found.value[honest.peer_id].value
    envelope = SignedRecord.from_msgpack(value)
    dht.store(record_key(RUN, "peer"), value, expiration_time=envelope.expires + 6 * DAY, subkey=honest.peer_id)
    time.sleep(0.5)
    stored = honest.dht.get(record_key(RUN, "peer"), latest=True).value[honest.peer_id]
    assert stored.expiration_time == envelope.expires  # the honest node kept what its author signed
    assert honest.records.fetch_peers()[honest.peer_id] == record
