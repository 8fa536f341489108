"""The scheduler role over a real DHT: a read of the peers' records that fails (a timeout on a loaded host, a
daemon gone) skips one look instead of taking the coordinator down, and is never taken for an empty swarm."""

from __future__ import annotations

import hivemind
import pytest

from swarm.control.records import SwarmRecords
from swarm.coordinator.scheduler_role import SchedulerRole
from swarm.net.dht_shutdown import stop_dht
from swarm.net.identity import ensure_identity, load_identity
from swarm.run_config import RunConfig

pytestmark = pytest.mark.timeout(90)


def test_a_failed_read_of_the_records_skips_a_look_and_the_role_goes_on(tmp_path, caplog):
    key = str(tmp_path / "identity.key")
    ensure_identity(key)
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=key, start=True)
    records = SwarmRecords(dht, load_identity(key), "role")
    config = RunConfig.from_tables({}, run_id="role", min_peers=2)
    me = records.identity.peer_id
    role = SchedulerRole(config, config.to_spec(coordinator=me, vocab_size=256), me, records, gossip=None)
    try:
        role.tick()  # the DHT answers: nobody has joined yet
        assert role.scheduler.peers_online == 0
        role.scheduler.peers_online = 3  # what an earlier look saw
    finally:
        stop_dht(dht)  # from here the DHT answers nothing
    role.tick()  # no exception: this look is skipped, not taken for a swarm of nobody
    assert role.scheduler.peers_online == 3
    assert any("could not read the peers' records" in r.getMessage() for r in caplog.records)
