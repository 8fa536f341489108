"""A holder that takes a shard over starts it where the scheduler's newest commit left it, so no sample is skipped
or drawn twice; without that commit it uses the schedule's positions, and a bad committed position is refused."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from peers.data import Corpus, DataConfig
from peers.data_ledger import DataLedger, sample_status
from peers.holder_shards import HolderShards
from swarm.control.messages import Commit
from swarm.peer.data_holder import DataHolder
from swarm.peer.schedule_follower import ScheduleFollower


@pytest.fixture(scope="module")
def corpus():
    return Corpus.build(DataConfig(seq_len=32, batch_size=4))


def follower_that_saw(iteration: int, positions: dict) -> ScheduleFollower:
    """A peer's follower that received the scheduler's commit of `iteration` (the DHT is not read here)."""
    follower = ScheduleFollower(records=None, coordinator="scheduler", heartbeat=2.0)
    assert follower.on_message("scheduler", Commit(iteration=iteration, epoch=0, shards=positions))
    assert not follower.on_message("stranger", Commit(iteration=iteration + 1, epoch=0, shards={}))
    assert follower.is_committed(iteration, 0) and not follower.is_committed(iteration + 1, 0)
    return follower


def test_a_shard_taken_over_after_the_iteration_in_progress_starts_where_its_commit_left_it(corpus, caplog):
    giver = HolderShards(corpus, DataLedger(holder="a"))
    giver.assign([0], 2, {})
    giver.draw([0, 1], iteration=0, epoch=0)
    giver.commit(0)
    planned = giver.positions()  # the re-plan happens here, while iteration 1 is in progress
    giver.draw([0, 1], iteration=1, epoch=0)
    giver.commit(1)
    schedule = SimpleNamespace(data_holders=["a", "b"],
                               meta={"shards": {"a": [], "b": [1, 0]}, "num_shards": 2, "shard_positions": planned})
    taker = DataHolder(HolderShards(corpus, DataLedger(holder="b")), "b")
    taker.follow(schedule, 2, follower_that_saw(1, giver.positions()).committed_positions)
    taker.shards.draw([0, 1, 2, 3], iteration=2, epoch=1)
    taker.shards.commit(2)
    status = sample_status(giver.ledger.entries + taker.shards.ledger.entries)
    assert set(Counter(c["processed"] for c in status.values())) == {1}
    # a peer that did not see that commit falls back on the schedule's positions; a bad one is refused
    late = DataHolder(HolderShards(corpus, DataLedger(holder="b")), "b")
    late.follow(schedule, 5, follower_that_saw(1, giver.positions()).committed_positions)  # not iteration 4's
    assert late.shards.positions()["0"] == planned["0"] != giver.positions()["0"]
    bad = DataHolder(HolderShards(corpus, DataLedger(holder="b")), "b")
    bad.follow(schedule, 2, follower_that_saw(1, {"0": {"holder": 1, "num_holders": 2, "epoch": 0,
                                                        "cursor": 0}}).committed_positions)
    assert "gave a bad data position" in caplog.text
    assert bad.shards.positions()["0"] == planned["0"]


def test_a_holder_with_its_own_documents_draws_from_them_whatever_the_schedule_assigns(corpus):
    own = DataHolder(HolderShards(corpus, DataLedger(holder="own")), "own", own_data=True)
    schedule = SimpleNamespace(data_holders=["a", "own"], meta={"shards": {"a": [0, 1], "own": []}, "num_shards": 2})
    own.follow(schedule, 0, (-1, {}))
    assert list(own.shards.shards) == [0] and own.shards.shards[0].num_holders == 1


def test_a_holder_the_commit_left_out_puts_its_draws_back_and_one_counted_keeps_them(corpus):
    """Taken for gone while it ran (a frozen host that thawed), a holder sees itself in the commit's `left_out`:
    the commit did not count its microbatches, so its draws are requeued and its shard stands where it did."""
    follower = ScheduleFollower(records=None, coordinator="scheduler", heartbeat=2.0)
    schedule = SimpleNamespace(data_holders=["a", "b"], meta={"shards": {"a": [0], "b": [1]}, "num_shards": 2},
                               routes=[])
    holders = {p: DataHolder(HolderShards(corpus, DataLedger(holder=p)), p) for p in ("a", "b")}
    for h in holders.values():
        h.follow(schedule, 0, follower.committed_positions)
    before = holders["a"].shards.positions()
    for h in holders.values():
        h.shards.draw([0, 1], iteration=0, epoch=0)
    assert follower.on_message("scheduler", Commit(iteration=0, epoch=0, shards={}, left_out=("a",)))
    assert not holders["a"].settle(0, follower.left_out(0))
    assert holders["b"].settle(0, follower.left_out(0), retried=[(1, 1)])
    assert holders["a"].shards.positions() == before
    assert [e["event"] for e in holders["a"].shards.ledger.entries[-1:]] == ["requeued"]
    assert [e["event"] for e in holders["b"].shards.ledger.entries[-2:]] == ["retried", "processed"]
    # the same samples are drawn again, and once counted each is processed once
    holders["a"].shards.draw([0, 1], iteration=1, epoch=1)
    assert holders["a"].settle(1, frozenset())
    status = sample_status(holders["a"].shards.ledger.entries)
    assert set(Counter(c["processed"] for c in status.values())) == {1}
    assert all(c["requeued"] == 1 for c in status.values())


def test_a_holder_placed_from_the_next_iteration_waits_for_the_commit_of_the_one_in_progress(caplog):
    """Planned while iteration 4 ran, an epoch from 5 gives a joiner a shard a survivor drew from in 4: the
    schedule's positions are as of the commit of 3, so the joiner waits for the commit of 4 and takes its
    positions. An epoch whose positions are current (a rerun), or that says nothing readable, is not waited on."""
    import threading
    import time

    follower = follower_that_saw(3, {"0": {"holder": 0, "num_holders": 1, "epoch": 0, "cursor": 8}})
    later = {"0": {"holder": 0, "num_holders": 1, "epoch": 0, "cursor": 16}}
    stop = threading.Event()
    planned_during_4 = SimpleNamespace(epoch=2, meta={"positions_after": 3})
    timer = threading.Timer(0.3, lambda: follower.on_message("scheduler", Commit(iteration=4, epoch=1,
                                                                                  shards=later)))
    timer.start()
    began = time.monotonic()
    assert follower.positions_for(planned_during_4, 5, stop, timeout=10.0) == (4, later)
    assert 0.25 <= time.monotonic() - began < 5.0
    for meta in ({"positions_after": 4}, {"positions_after": "x"}, {}):  # current, unreadable, absent
        began = time.monotonic()
        assert follower.positions_for(SimpleNamespace(epoch=3, meta=meta), 5, stop)[0] == 4
        assert time.monotonic() - began < 0.2
    # the commit never comes: after the wait, what it has (the holder falls back on the schedule's positions)
    assert follower.positions_for(SimpleNamespace(epoch=4, meta={"positions_after": 4}), 6, stop, timeout=0.3) \
        == (4, later)
    assert "no commit of iteration 5 came" in caplog.text
