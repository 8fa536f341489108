"""`Succession.connect_control_plane`: a peer's gossip links to other peers' sidecars, between real sidecars on
loopback. The links are dialled together, so a joiner facing silent peers (a frozen host, or a dead one whose record
still lives) loses one dial's timeout, not one per silent peer; links to peers gone from the records are let go and
made again to others; after a wave that linked none (on a starved host, handshakes made all at once all miss their
timeout) fewer are dialled at once, and more again once they go through.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from swarm.control.gossip import GossipClient
from swarm.net.identity import ensure_identity
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.peer.succession import CONTROL_CONNECT_TIMEOUT, CONTROL_LINKS, CONTROL_WAVES, Succession
from swarm.wire import PeerRecord

pytestmark = pytest.mark.timeout(120)


def record(peer_id: str, control_addr: str) -> PeerRecord:
    return PeerRecord(peer_id=peer_id, stage=-1, seconds_per_layer=0.05, memory_slots=3,
                      control_addrs=(control_addr,))


def test_links_are_dialled_together_and_follow_the_live_records(tmp_path):
    keys = [str(tmp_path / f"{i}.key") for i in range(4)]
    ids = [ensure_identity(k) for k in keys]
    clients = [GossipClient() for _ in range(3)]
    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]  # accept, never speak: frozen sidecars
    try:
        with ThreadPoolExecutor(3) as pool:
            infos = list(pool.map(lambda i: clients[i].start(keys[i], log_path=str(tmp_path / f"{i}.log")), range(3)))
        me, live = clients[0], {ids[i]: record(ids[i], infos[i].maddrs[0]) for i in (1, 2)}
        frozen = {f"frozen-{i}": record(f"frozen-{i}", f"/ip4/127.0.0.1/tcp/{s.getsockname()[1]}/p2p/{ids[3]}")
                  for i, s in enumerate(silent)}
        follower = ScheduleFollower(records=None, coordinator="coordinator", heartbeat=1.0)
        succession = Succession(ids[0], None, me, follower, make_role=None, iteration=lambda: 0)

        start = time.monotonic()
        linked = succession.connect_control_plane({ids[0]: record(ids[0], infos[0].maddrs[0]), **live, **frozen})
        took = time.monotonic() - start
        assert linked == set(live)  # never itself, never a silent peer
        assert took < 2 * CONTROL_CONNECT_TIMEOUT, took  # the two silent peers timed out together
        assert set(live) <= set(me.status()["peers"])

        # a linked peer's record is gone (it died): its link is let go, and a newcomer is linked instead
        clients[1].close()
        newcomer = GossipClient()
        clients.append(newcomer)
        new_id = ensure_identity(str(tmp_path / "new.key"))
        new_info = newcomer.start(str(tmp_path / "new.key"), log_path=str(tmp_path / "new.log"))
        assert succession.connect_control_plane({ids[2]: live[ids[2]], new_id: record(new_id, new_info.maddrs[0])}) \
            == {ids[2], new_id}
    finally:
        for s in silent:
            s.close()
        for c in clients:
            c.close()


def test_after_a_wave_that_linked_none_fewer_are_dialled_at_once_then_more_again(tmp_path):
    keys = [str(tmp_path / f"{i}.key") for i in range(5)]
    ids = [ensure_identity(k) for k in keys]
    clients = [GossipClient() for _ in range(5)]
    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(CONTROL_LINKS + 2)]
    try:
        with ThreadPoolExecutor(5) as pool:
            infos = list(pool.map(lambda i: clients[i].start(keys[i], log_path=str(tmp_path / f"{i}.log")), range(5)))
        follower = ScheduleFollower(records=None, coordinator="coordinator", heartbeat=1.0)
        succession = Succession(ids[0], None, clients[0], follower, make_role=None, iteration=lambda: 0)
        # every sidecar silent (a starved host, as the dials see it): a wave of 8, then one of the 2 left, in vain
        frozen = {f"frozen-{i}": record(f"frozen-{i}", f"/ip4/127.0.0.1/tcp/{s.getsockname()[1]}/p2p/{ids[0]}")
                  for i, s in enumerate(silent)}
        start = time.monotonic()
        assert succession.connect_control_plane(frozen) == set()
        assert time.monotonic() - start < (CONTROL_WAVES + 1) * CONTROL_CONNECT_TIMEOUT  # two waves, no more
        # the next call dials one at first (half the 2 of the last wave), then two: 3 of the 4 live peers
        live = {ids[i]: record(ids[i], infos[i].maddrs[0]) for i in range(1, 5)}
        assert len(succession.connect_control_plane(live)) == 3
        assert succession.connect_control_plane(live) == set(live)  # the fourth at the next call
    finally:
        for s in silent:
            s.close()
        for c in clients:
            c.close()
