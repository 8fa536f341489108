"""A stranger floods a run's DHT key with the records of throw-away identities, as it would: through a DHT node of
its own, with as many keys as it cares to make.

A DHT read returns every record under a key, and hivemind refuses a reply over 4 MiB. Before the run's nodes knew
who the run admits, 120 strangers' peer records of ~100 KiB (the largest the schema allows) emptied every read of the
peers' key (48 of them cut a read to 42 records of 49): the scheduler would have seen no peer and taken every one for
gone. Now every node that knows the run stores and relays only its members' records (`RecordWriters`); a peer's node,
which learns the run from the run spec it reads through it, drops what it took in before (`Node.restrict_writers`).
"""

from __future__ import annotations

import hivemind
import pytest

from swarm.control.membership import token_proof
from swarm.control.node import Node
from swarm.control.record_writers import RecordWriters
from swarm.control.records import SwarmRecords
from swarm.net.dht_pipe import make_commands_safe
from swarm.net.dht_shutdown import stop_dht
from swarm.net.identity import ensure_identity, load_identity
from swarm.wire import PeerRecord, PeerState

RUN = "run-record-flood"
TOKEN = "the-runs-join-token-0123456789"
STRANGERS = 48
pytestmark = pytest.mark.timeout(240)


def identity(path):
    ensure_identity(str(path))
    return load_identity(str(path))


def heartbeat(records: SwarmRecords, **fields) -> None:
    record = PeerRecord(peer_id=records.identity.peer_id, stage=0, seconds_per_layer=0.01, memory_slots=3,
                        state=PeerState.ONLINE, **fields)
    assert records.publish_peer(record, ttl=60)


def largest_record(peer_id: str) -> PeerRecord:
    """A peer record as large as the schema lets it be (~100 KiB)."""
    ids = [f"Qm{i:0126d}" for i in range(256)]
    return PeerRecord(peer_id=peer_id, stage=0, seconds_per_layer=0.01, memory_slots=3,
                      links={p: (0.1, 1e6) for p in ids}, unreachable=tuple(ids),
                      addresses=tuple("/dns/" + "a" * 507 for _ in range(32)),
                      control_addrs=tuple("/dns/" + "b" * 507 for _ in range(32)))


@pytest.fixture
def run(tmp_path):
    """The coordinator's node (it knows the run from the start), a member's node (not yet: it has not read the run
    spec), and a stranger's DHT node that validates nothing."""
    started = []
    try:
        coordinator = Node(str(tmp_path / "coordinator.key"), RUN) if identity(tmp_path / "coordinator.key") else None
        started.append(coordinator.stop)
        coordinator.start_dht(writers=RecordWriters(RUN, coordinator.peer_id, token=TOKEN))
        member = Node(str(tmp_path / "member.key"), RUN) if identity(tmp_path / "member.key") else None
        started.append(member.stop)
        member.start_dht(coordinator.visible_maddrs(), proof=token_proof(TOKEN, member.peer_id, RUN))
        identity(tmp_path / "mallory.key")
        attacker = hivemind.DHT(initial_peers=coordinator.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                identity_path=str(tmp_path / "mallory.key"), start=True)
        started.append(lambda: stop_dht(attacker))
        make_commands_safe(attacker)
        heartbeat(coordinator.records)
        heartbeat(member.records)
        yield coordinator, member, attacker
    finally:
        for stop in reversed(started):
            stop()


def writers(coordinator: Node) -> RecordWriters:
    return RecordWriters(RUN, coordinator.peer_id, token=TOKEN)


def test_what_a_stranger_stored_before_a_peer_knew_the_run_is_dropped_once_it_does(run, tmp_path):
    coordinator, member, attacker = run
    stranger = SwarmRecords(attacker, identity(tmp_path / "stranger.key"), RUN)
    heartbeat(stranger)
    assert stranger.identity.peer_id in member.records.fetch_peers()  # it got in while the member knew nothing
    assert stranger.identity.peer_id not in coordinator.records.fetch_peers()  # the coordinator refused it

    assert member.restrict_writers(writers(coordinator)) >= 1
    for node in (coordinator, member):
        assert set(node.records.fetch_peers()) == {coordinator.peer_id, member.peer_id}
    heartbeat(stranger)  # and from now on the member refuses it too
    assert set(member.records.fetch_peers()) == {coordinator.peer_id, member.peer_id}


def test_a_flood_of_strangers_records_leaves_the_runs_reads_whole(run, tmp_path):
    coordinator, member, attacker = run
    member.restrict_writers(writers(coordinator))
    for i in range(STRANGERS):
        sybil = SwarmRecords(attacker, identity(tmp_path / f"sybil-{i}.key"), RUN)
        sybil.publish_peer(largest_record(sybil.identity.peer_id), ttl=60)
    proof = token_proof("another-runs-token-0123456789", "QmNobody", RUN)
    thief = SwarmRecords(attacker, identity(tmp_path / "thief.key"), RUN, proof=proof)  # someone else's proof
    thief.publish_peer(largest_record(thief.identity.peer_id), ttl=60)
    for node in (coordinator, member):
        assert set(node.records.fetch_peers()) == {coordinator.peer_id, member.peer_id}
    assert len(largest_record("QmX").to_msgpack()) > 100_000


def test_an_open_run_stores_anyones_records(run, tmp_path):
    """The known limit (docs/security.md): in an open run there is nobody to refuse, so a flood would land."""
    coordinator, member, attacker = run
    for node in (coordinator, member):
        node.restrict_writers(RecordWriters(RUN, coordinator.peer_id, "open"))
    strangers = [SwarmRecords(attacker, identity(tmp_path / f"stranger-{i}.key"), RUN) for i in range(3)]
    for stranger in strangers:
        heartbeat(stranger)
    for node in (coordinator, member):
        assert {s.identity.peer_id for s in strangers} <= set(node.records.fetch_peers())


def test_an_allow_listed_run_stores_the_listed_peers_records_only(run, tmp_path):
    coordinator, member, attacker = run
    allow = RecordWriters(RUN, coordinator.peer_id, "allow", frozenset({member.peer_id}))
    for node in (coordinator, member):
        node.restrict_writers(allow)
    stranger = SwarmRecords(attacker, identity(tmp_path / "stranger.key"), RUN,
                            proof=token_proof(TOKEN, "unused", RUN))  # a token is no key to an allow-listed run
    heartbeat(stranger)
    heartbeat(member.records)
    for node in (coordinator, member):
        assert set(node.records.fetch_peers()) == {coordinator.peer_id, member.peer_id}


def test_a_node_without_the_token_still_reads_the_members_records(run, tmp_path):
    """An onlooker (the monitor) has no token: it checks the proofs' shape, so members' records pass and a
    stranger's without a proof does not."""
    coordinator, member, attacker = run
    member.restrict_writers(RecordWriters(RUN, coordinator.peer_id, "token"))  # as if it held no token
    stranger = SwarmRecords(attacker, identity(tmp_path / "stranger.key"), RUN)
    heartbeat(stranger)
    heartbeat(member.records)
    assert set(member.records.fetch_peers()) == {coordinator.peer_id, member.peer_id}
