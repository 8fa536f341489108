"""Which holder draws which of the run's shards: a shard follows the holders that inject (a full pipeline's column
may start at another holder after a re-plan), and a holder that takes a shard over starts it where the newest
commit left it, so no sample is skipped or drawn twice."""

from __future__ import annotations

import queue
from collections import Counter
from types import SimpleNamespace

import pytest

from peers.data import Corpus, DataConfig
from peers.data_ledger import DataLedger, sample_status
from peers.holder_shards import HolderShards
from swarm.control.gossip import GossipMessage
from swarm.control.messages import Commit, as_gossip
from swarm.coordinator.shard_assignment import assign_shards, shards_to_injectors


def test_a_holder_keeps_its_shards_and_a_departed_holders_go_to_the_drawer_with_the_fewest():
    shards = assign_shards({"a": [0], "b": [1, 3], "gone": [2]}, ["a", "b"], ["a", "b"], 4)
    assert shards == {"a": [0, 2], "b": [1, 3]}
    # a new drawer takes one over from a drawer carrying several; one with its own documents takes none
    shards = assign_shards({"a": [0, 2], "b": [1]}, ["a", "b", "new", "own"], ["a", "b", "new"], 3)
    assert shards == {"a": [0], "b": [1], "new": [2], "own": []}


def test_the_shards_of_a_holder_that_injects_nothing_go_to_one_that_does():
    shards, moves = shards_to_injectors({"a": [0], "b": [1], "c": [2]}, injecting={"b"}, drawers=["a", "b", "c"])
    assert shards == {"a": [], "b": [1, 0, 2], "c": []}
    assert moves == [(0, "a", "b"), (2, "c", "b")]
    # two injectors: each takes from the idle ones in turn, and one left without a shard takes one
    shards, _ = shards_to_injectors({"a": [0, 1, 2], "b": [], "c": []}, injecting={"b", "c"},
                                    drawers=["a", "b", "c"])
    assert sorted(shards["b"] + shards["c"]) == [0, 1, 2] and shards["b"] and shards["c"] and not shards["a"]
    # a holder with its own documents neither gives nor takes the run's shards; nobody to give them to: unchanged
    assert shards_to_injectors({"a": [0], "own": []}, injecting={"own"}, drawers=["a"]) == ({"a": [0], "own": []}, [])


@pytest.fixture(scope="module")
def corpus():
    return Corpus.build(DataConfig(seq_len=32, batch_size=4))


def holder_peer(corpus, holder: str, iteration: int):
    """A data holder's `Peer`, only as far as its shards and the scheduler's commit notices go."""
    from swarm.peer.peer import Peer, PeerOptions

    peer = Peer.__new__(Peer)
    peer.options = PeerOptions(initial_peers=(), identity_path="unused", run_id="shards")
    peer.peer_id, peer.stage, peer.iteration, peer.scheduler = holder, 0, iteration, "scheduler"
    peer.data = HolderShards(corpus, DataLedger(holder=holder))
    peer._role, peer._commits, peer._raw, peer._committed_positions = None, set(), queue.Queue(), (-1, {})
    return peer


def commit(iteration: int, positions: dict) -> GossipMessage:
    return as_gossip(Commit(iteration=iteration, epoch=0, shards=positions), "shards", "scheduler")


def test_a_shard_taken_over_after_the_iteration_in_progress_starts_where_its_commit_left_it(corpus, caplog):
    giver = HolderShards(corpus, DataLedger(holder="a"))
    giver.assign([0], 2, {})
    giver.draw([0, 1], iteration=0, epoch=0)
    giver.commit(0)
    planned = giver.positions()  # the re-plan happens here, while iteration 1 is in progress
    giver.draw([0, 1], iteration=1, epoch=0)
    giver.commit(1)
    taker = holder_peer(corpus, "b", iteration=2)
    taker._on_gossip(commit(1, giver.positions()))
    assert (1, 0) in taker._commits
    schedule = SimpleNamespace(data_holders=["a", "b"],
                               meta={"shards": {"a": [], "b": [1, 0]}, "num_shards": 2, "shard_positions": planned})
    taker._set_shards(schedule)
    taker.data.draw([0, 1, 2, 3], iteration=2, epoch=1)
    taker.data.commit(2)
    status = sample_status(giver.ledger.entries + taker.data.ledger.entries)
    assert set(Counter(c["processed"] for c in status.values())) == {1}
    # a peer that did not see that commit falls back on the schedule's positions; a bad one is refused
    late = holder_peer(corpus, "b", iteration=5)  # the newest commit it saw is not that of iteration 4
    late._on_gossip(commit(1, giver.positions()))
    late._set_shards(schedule)
    assert late.data.positions()["0"] == planned["0"] != giver.positions()["0"]
    bad = holder_peer(corpus, "b", iteration=2)
    bad._on_gossip(commit(1, {"0": {"holder": 1, "num_holders": 2, "epoch": 0, "cursor": 0}}))
    bad._set_shards(schedule)
    assert "gave a bad data position" in caplog.text
    assert bad.data.positions()["0"] == planned["0"]
