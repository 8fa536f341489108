"""Signed DHT records between real processes: round trip, expiry without heartbeat, forged records ignored."""

from __future__ import annotations

import dataclasses
import logging
import time

import hivemind
import pytest
from hivemind.utils import get_dht_time

from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.constants import WIRE_VERSION
from swarm.control.records import SwarmRecords, record_key
from swarm.events import EVENT_ATTR
from swarm.net.dht_shutdown import stop_dht
from swarm.net.identity import ensure_identity, load_identity
from swarm.wire import PeerRecord, PeerState, RunSpec, ScheduleMsg, SignedRecord, pack
from tests.utils.processes import join_or_stop, spawn
from tests.utils.swarm_workers import records_peer

RUN = "run-records"
pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    """This process as coordinator: its own DHT, signing with its key file."""
    key = str(tmp_path_factory.mktemp("coord") / "identity.key")
    ensure_identity(key)
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key, start=True)
    try:
        yield SwarmRecords(dht, load_identity(key), RUN)
    finally:
        stop_dht(dht)


@pytest.fixture(scope="module")
def peer(coordinator, tmp_path_factory):
    """Another OS process with its own DHT, bootstrapped from the coordinator's."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    cmd_q, res_q = ctx.Queue(), ctx.Queue()
    maddrs = [str(m) for m in coordinator.dht.get_visible_maddrs()]
    key = str(tmp_path_factory.mktemp("peer") / "identity.key")
    proc = spawn(records_peer, maddrs, key, RUN, cmd_q, res_q)
    try:
        tag, peer_id = res_q.get(timeout=60)
        assert tag == "ready" and peer_id == ensure_identity(key)  # p2pd runs under the key file's peer id

        def call(*cmd, timeout=30):
            cmd_q.put(cmd)
            return res_q.get(timeout=timeout)[1]

        call.peer_id = peer_id
        yield call
        cmd_q.put(("stop",))
    finally:
        join_or_stop(proc)


def schedule(epoch: int, a: str, b: str) -> Schedule:
    return Schedule(epoch=epoch, rules=PathRules(num_stages=2, stages_per_path=2), placement={a: 0, b: 1},
                    memory={a: 3, b: 3}, routes=(Route(microbatch=0, origin=a, stages=(1,), peers=(b,)),),
                    run_id=RUN)


def test_round_trip_between_processes(coordinator, peer):
    me = coordinator.identity.peer_id
    assert me == str(coordinator.dht.peer_id)
    spec = RunSpec(run_id=RUN, model={"flavor": "tiny"}, stages=2, skip_ratio=0.0, hyperparameters={"lr": 1e-3},
                   data={"seed": 1}, coordinator=me)
    assert coordinator.publish_run_spec(spec)
    msg = ScheduleMsg.from_schedule(schedule(3, me, peer.peer_id))
    assert coordinator.publish_schedule(msg)
    assert peer("publish_peer", 1, 1.0) is True  # short ttl: the heartbeat test must outlive it

    got_spec, got_sched = peer("fetch", me, [me])
    assert got_spec == spec and got_sched == msg and got_sched.to_schedule() == schedule(3, me, peer.peer_id)
    assert peer("fetch", "QmSomeoneElse", ["QmSomeoneElse"]) == (None, None)  # right signer required

    peers = coordinator.fetch_peers()
    assert set(peers) == {peer.peer_id}
    assert peers[peer.peer_id].stage == 1 and peers[peer.peer_id].links == {"QmOther": (0.001, 2e8)}


def test_a_store_the_dht_does_not_finish_in_time_is_false_not_an_error(coordinator, peer, caplog):
    """The scheduler publishes each epoch through this call: a loaded DHT must not take the coordinator down. The
    slow store is an event (benchmarks count them to tell a loaded machine's runs)."""
    msg = ScheduleMsg.from_schedule(schedule(4, coordinator.identity.peer_id, peer.peer_id))
    with caplog.at_level(logging.WARNING):
        assert coordinator.publish_schedule(msg, timeout=1e-6) is False  # neither the store nor its read-back in time
    slow = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert slow == [{"event": "record_store_slow", "kind": "schedule", "seconds": 1e-6}]
    assert coordinator.publish_schedule(msg)  # the DHT itself is fine


def test_record_expires_without_heartbeat(coordinator, peer):
    assert peer("heartbeat", 0.3, 1.2)
    time.sleep(1.5)  # longer than the ttl: only the heartbeat keeps the record alive
    assert coordinator.fetch_peers()[peer.peer_id].state == PeerState.ONLINE
    assert peer("stop_heartbeat", False) >= 4
    time.sleep(0.6)
    _, age = coordinator.fetch_peers_with_age(1.2)[peer.peer_id]
    assert 0.5 <= age <= 1.2  # the heartbeat stopped: its last record ages (it was refreshed every 0.3 s before)
    time.sleep(1.5)
    assert peer.peer_id not in coordinator.fetch_peers()


def test_leaving_peer_announces_it(coordinator, peer):
    assert peer("heartbeat", 0.3, 5.0)
    assert peer("stop_heartbeat", True) >= 1
    assert coordinator.fetch_peers()[peer.peer_id].state == PeerState.LEAVING


def test_forged_garbage_and_replayed_records_ignored(coordinator, peer, tmp_path, caplog):
    me, dht = coordinator.identity.peer_id, coordinator.dht
    keys = [str(tmp_path / f"mallory{i}.key") for i in range(4)]
    m1, m2, m3, m4 = (load_identity(k) for k in keys if ensure_identity(k))
    honest = PeerRecord(peer_id=me, stage=0, seconds_per_layer=0.01, memory_slots=3, state=PeerState.ONLINE)
    assert coordinator.publish_peer(honest)
    exp = get_dht_time() + 30

    def envelope(signer, kind, subkey, body, expires=exp, run=RUN):
        sig = signer.sign(SignedRecord.signed_bytes(kind, run, subkey, expires, body))
        return SignedRecord(kind=kind, body=body, expires=expires, public_key=signer.public_key, signature=sig)

    def record(peer_id, slots=3):
        return PeerRecord(peer_id=peer_id, stage=0, seconds_per_layer=1e-6, memory_slots=slots).to_msgpack()

    victim = peer.peer_id
    signed = envelope(m1, "peer", m1.peer_id, record(m1.peer_id, 3))
    forged = {
        "QmGarbage1": b"\xc1not msgpack",
        "QmGarbage2": pack({"version": WIRE_VERSION, "kind": "peer"}),
        "QmGarbage3": 12345,
        victim: envelope(m2, "peer", victim, record(victim)).to_msgpack(),  # signed under a victim's subkey
        m2.peer_id: envelope(m2, "peer", m2.peer_id, record(victim)).to_msgpack(),  # record naming another peer
        m1.peer_id: dataclasses.replace(signed, body=record(m1.peer_id, 4)).to_msgpack(),  # tampered after signing
        m3.peer_id: envelope(m3, "peer", m3.peer_id, record(m3.peer_id), run="other-run").to_msgpack(),  # other run
    }
    for subkey, value in forged.items():
        assert dht.store(record_key(RUN, "peer"), value, expiration_time=exp, subkey=subkey)
    # a record whose signed expiry has passed, replayed with a long DHT expiry
    stale = envelope(m4, "peer", m4.peer_id, record(m4.peer_id), expires=get_dht_time() - 1)
    assert dht.store(record_key(RUN, "peer"), stale.to_msgpack(), expiration_time=exp, subkey=m4.peer_id)
    # a schedule signed by someone who is not the scheduler, with a higher epoch
    bad_sched = ScheduleMsg.from_schedule(schedule(99, me, victim)).to_msgpack()
    assert dht.store(record_key(RUN, "schedule"), envelope(m1, "schedule", m1.peer_id, bad_sched).to_msgpack(),
                     expiration_time=exp, subkey=m1.peer_id)
    assert coordinator.publish_schedule(ScheduleMsg.from_schedule(schedule(5, me, victim)))

    with caplog.at_level(logging.WARNING, logger="swarm.control.records"):
        peers = coordinator.fetch_peers()
        sched = coordinator.fetch_schedule(signers={me})
    assert peers == {me: honest}
    assert sched.epoch == 5
    text = caplog.text
    for needle in ("malformed msgpack", "record.body", "not bytes", "not by the subkey's owner", "bad signature",
                   "signed by", "expired", "not signed by a peer trusted"):
        assert needle in text, needle
    assert text.count("ignored") == 9  # one warning per forged entry (8 peer records, 1 schedule)
    assert peer("fetch", me, [me])[1].epoch == 5  # the other process sees the same
