"""The scheduler role over a real DHT: a read of the peers' records that fails (a timeout on a loaded host, a
daemon gone) skips one look instead of taking the coordinator down, and is never taken for an empty swarm; a read
stuck on a DHT that stopped answering never holds up the role's loop (the control messages a commit waits for)."""

from __future__ import annotations

import os
import signal
import time

import hivemind
import pytest

from swarm.control.records import SwarmRecords
from swarm.coordinator.scheduler_role import TICK_WAIT, SchedulerRole
from swarm.net.dht_shutdown import stop_dht
from swarm.net.identity import ensure_identity, load_identity
from swarm.run_config import RunConfig

pytestmark = pytest.mark.timeout(90)


def make_role(tmp_path, heartbeat: float | None = None) -> tuple[hivemind.DHT, SchedulerRole]:
    key = str(tmp_path / "identity.key")
    ensure_identity(key)
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key, start=True)
    records = SwarmRecords(dht, load_identity(key), "role")
    tables = {"swarm": {"heartbeat": heartbeat}} if heartbeat is not None else {}
    config = RunConfig.from_tables(tables, run_id="role", min_peers=2)
    me = records.identity.peer_id
    return dht, SchedulerRole(config, config.to_spec(coordinator=me, vocab_size=256), me, records, gossip=None)


def tick_until(role: SchedulerRole, done, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, "the role's records poller made no progress"
        role.tick()


def test_a_failed_read_of_the_records_skips_a_look_and_the_role_goes_on(tmp_path):
    dht, role = make_role(tmp_path)
    try:
        tick_until(role, lambda: role.poller.reads >= 1)  # the DHT answers: nobody has joined yet
        role.tick()
        assert role.scheduler.peers_online == 0
    finally:
        stop_dht(dht)  # from here the DHT answers nothing
    tick_until(role, lambda: role.poller.failures >= 1)  # no exception: the look is skipped
    role.poller.take()  # a read that was under way as the DHT stopped
    role.scheduler.peers_online = 3  # what an earlier look saw
    for _ in range(3):
        role.tick()
    assert role.scheduler.peers_online == 3, "a failed read was taken for a swarm of nobody"
    assert role.poller.running
    role.close()
    assert not role.poller.running


def test_a_dht_that_stops_answering_does_not_hold_up_the_roles_loop(tmp_path):
    dht, role = make_role(tmp_path)
    try:
        tick_until(role, lambda: role.poller.reads >= 1)
        os.kill(dht.pid, signal.SIGSTOP)  # a read now waits out its timeout, as on a node that went silent
        try:
            reads = role.poller.reads
            time.sleep(TICK_WAIT * 2)  # the poller is now stuck in a read
            for _ in range(6):
                began = time.monotonic()
                role.tick()
                assert time.monotonic() - began < TICK_WAIT + 0.5, "the loop waited on the DHT"
            assert role.poller.reads <= reads + 1  # nothing was read meanwhile: the look was skipped, not faked
        finally:
            os.kill(dht.pid, signal.SIGCONT)
        reads = role.poller.reads
        tick_until(role, lambda: role.poller.reads > reads)  # reads resume once it answers again
    finally:
        role.close()
        stop_dht(dht)


def test_a_swarm_that_beats_slowly_has_its_records_read_a_few_times_per_heartbeat(tmp_path):
    dht, role = make_role(tmp_path, heartbeat=8.0)
    try:
        tick_until(role, lambda: role.poller.reads >= 1)
        reads, began = role.poller.reads, time.monotonic()
        while time.monotonic() - began < 5.0:
            role.tick()
        # every 8 / READS_PER_HEARTBEAT = 2 s, not at every 0.5 s tick (10 reads): each read is a DHT lookup
        assert 1 <= role.poller.reads - reads <= 3
    finally:
        role.close()
        stop_dht(dht)
