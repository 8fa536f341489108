"""End to end behind NAT: a coordinator and a public data holder on the hub, home peers behind two NAT routers that
drop every inbound connection. Home peers reach each other only through the coordinator's relay; the run trains
to the end with every peer placed, none declared gone, and each stage group bit-identical after every step."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from peers.data_ledger import committed, read_ledger, sample_status
from swarm.local.local_swarm import LocalSwarm
from swarm.local.nat_network import NatNetwork, unavailable_reason
from tests.utils.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]

RUN = "nat"
ITERATIONS = 6
# host 0: public data holder on stage 0; hosts 1-3 at home: 1 (home 0) and 2 (home 1) pinned to stage 1, 3 (home 1)
# a data holder on stage 0: a home peer in every stage, and stage 1's two copies behind two different routers
HOMES = [None, 0, 1, 1]
STAGES = [0, 1, 1, 0]
COORDINATOR_ARGS = ["--iterations", str(ITERATIONS), "--min-peers", str(len(HOMES)), "--stages", "2", "--skip",
                    "0", "--seed", "0", "--microbatches", "2", "--relay"]


def test_home_peers_behind_nat_train_through_the_relay(tmp_path):
    net = NatNetwork(HOMES, tag="t" + str(int(time.time()) % 10000))
    peer_args = [["--stage", str(s), "--log-param-digest", "--iteration-deadline", "90",
                  "--reachability", "public" if net.is_public(i) else "relayed",
                  "--ledger", str(tmp_path / f"ledger-{i:02d}.jsonl")] for i, s in enumerate(STAGES)]
    with net:
        swarm = LocalSwarm(tmp_path, len(HOMES), run_id=RUN, coordinator_args=COORDINATOR_ARGS, peer_args=peer_args,
                           network=net)
        try:
            swarm.start()
            records = swarm.watch(ITERATIONS, timeout=150)
            for proc in swarm.peers:
                proc.wait(timeout=60)
        finally:
            swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    assert not swarm.events("declared_gone"), swarm.events("declared_gone")
    verdicts = [[e["reachability"] for e in swarm.events("reachability", who=f"peer-{i:02d}")] for i in range(4)]
    assert verdicts == [["public"], ["relayed"], ["relayed"], ["relayed"]], verdicts
    for i in range(len(HOMES)):
        placed = swarm.events("placed", who=f"peer-{i:02d}")
        assert placed and placed[0]["stage"] == STAGES[i], (i, placed)
    # both home copies of stage 1 trained every step and hold bit-identical weights after each
    digests: dict[tuple[int, int], dict[int, str]] = defaultdict(dict)
    for i in range(len(HOMES)):
        for e in swarm.events("param_digest", who=f"peer-{i:02d}"):
            digests[(e["iteration"], e["stage"])][i] = e["digest"]
    assert len(digests) == 2 * ITERATIONS, sorted(digests)
    for (it, stage), group in digests.items():
        assert sorted(group) == [i for i, s in enumerate(STAGES) if s == stage], (it, stage, group)
        assert len(set(group.values())) == 1, (it, stage, group)
    # every sample handed out was processed exactly once (the holders' ledgers against the scheduler's commits)
    entries = [e for f in sorted(tmp_path.glob("ledger-*.jsonl")) for e in read_ledger(f)]
    status = sample_status(entries, committed(records))
    assert status and {c["processed"] for c in status.values()} == {1}, status
    went_ahead = [line for i in (1, 2) for line in (tmp_path / f"peer-{i:02d}.log").read_text().splitlines()
                  if "went ahead without" in line]
    assert not went_ahead, went_ahead


def test_a_member_that_cannot_be_dialled_is_told_so_and_restarts_relayed(tmp_path):
    """A home peer that leaves its reachability to the peer (the default, auto) announces its private address: the
    coordinator's dial-back finds nothing takes a connection there and tells it, with what to do; the public peer is
    not told. The coordinator relays, so the home peer restarts itself relayed (same process, same key) and the run
    trains with it through the relay, nobody declared gone."""
    net = NatNetwork([None, 0, None], tag="d" + str(int(time.time()) % 10000))
    with net:
        swarm = LocalSwarm(tmp_path, 2, run_id="dial", network=net,
                           peer_args=[["--stage", "0"], ["--stage", "1"], ["--stage", "1"]],
                           coordinator_args=["--iterations", "4", "--min-peers", "3", "--stages", "2", "--skip",
                                             "0", "--relay"])
        try:
            swarm.start()
            # the run starts with a third (public) peer, joining once the home peer restarted: a run that had
            # already trained its 4 iterations would leave nothing to restart for
            wait_for(lambda: swarm.events("restarting", who="peer-01"), 90, "the home peer restarting relayed")
            swarm.add_peer(2)
            records = swarm.watch(4, timeout=150)
            home = swarm.peers[1]
            home.wait(timeout=60)  # the restarted process finishes the run (its pid is the one started)
        finally:
            swarm.stop()
    told = swarm.events("not_dialable", who="peer-01")
    assert told and told[0]["relay"] is True and told[0]["tried"] and "--announce-addr" in told[0]["advice"]
    assert all(a.split("/")[2].startswith("192.168.") for a in told[0]["tried"]), told[0]["tried"]
    assert not swarm.events("not_dialable", who="peer-00")
    verdicts = swarm.events("not_dialable", who="coordinator")
    assert verdicts and {v["peer"] for v in verdicts} == {told[0]["node"]}, verdicts
    assert [e["reachability"] for e in swarm.events("restarting", who="peer-01")] == ["relayed"]
    assert [e["reachability"] for e in swarm.events("reachability", who="peer-01")] == ["relayed"]
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    placed = swarm.events("placed", who="peer-01")
    assert placed and placed[-1]["stage"] == 1 and placed[-1]["node"] == told[0]["node"]  # same key, relayed
    assert not swarm.events("declared_gone"), swarm.events("declared_gone")


def test_two_home_peers_of_a_stage_that_cannot_reach_each_other_are_split(tmp_path):
    """No relay: stage 1's two home peers, behind two routers, can reach the public holder but not each other, so
    they cannot average. Each reports the other; the scheduler sees both alive and reporting each other, and
    re-plans with one of them sitting out instead of letting their copies drift apart. The run trains on."""
    net = NatNetwork([None, 0, 1], tag="s" + str(int(time.time()) % 10000))
    peer_args = [["--stage", s, "--log-param-digest", "--iteration-deadline", "60"] for s in ("0", "1", "1")]
    with net:
        swarm = LocalSwarm(tmp_path, 3, run_id="split", network=net, peer_args=peer_args,
                           coordinator_args=["--iterations", "6", "--min-peers", "3", "--stages", "2", "--skip", "0",
                                             "--seed", "0", "--microbatches", "2"])
        try:
            swarm.start()
            records = swarm.watch(6, timeout=150)
        finally:
            swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, 7))
    home = {e["node"] for i in (1, 2) for e in swarm.events("placed", who=f"peer-{i:02d}")}
    (split,) = swarm.events("estranged", who="coordinator")
    assert {split["peer"], split["partner"]} == home and split["stage"] == 1, split
    assert not swarm.events("declared_gone"), swarm.events("declared_gone")  # nobody was taken for dead
    told = [e for e in swarm.events("estranged", who="peer-*") if e["node"] == split["peer"]]
    assert told and told[0]["partner"] == split["partner"], told  # its volunteer hears why, and what to do
    # from the epoch that split them, one copy of stage 1 trains; the one sitting out took no step
    after = [s for s in swarm.schedules() if split["peer"] not in s["placement"]]
    assert after and split["partner"] in after[-1]["placement"]
    start = after[0]["meta"]["start_iteration"]
    stepped = {e["iteration"] for e in swarm.events("param_digest", who="peer-*") if e["node"] == split["peer"]}
    assert not {i for i in stepped if i >= start}, (stepped, start)
