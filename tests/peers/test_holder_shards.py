"""HolderShards: a holder's draws, rewound when an iteration is abandoned, and a shard handed over at its committed
position: every sample processed exactly once."""

from collections import Counter

import pytest
import torch

from peers.data import Corpus, DataConfig
from peers.data_ledger import DataLedger, committed, sample_status
from peers.holder_shards import HolderShards


@pytest.fixture(scope="module")
def corpus():
    return Corpus.build(DataConfig(seq_len=32, batch_size=4))


def test_an_abandoned_iteration_draws_the_same_samples_again(corpus):
    data = HolderShards(corpus, DataLedger(holder="a"))
    data.assign([0, 2], 3, {})
    first = data.draw([5, 6, 7], iteration=0, epoch=0)
    data.rewind(0)
    again = data.draw([5, 6, 7], iteration=0, epoch=1)
    assert all(torch.equal(first[m], again[m]) for m in first)
    data.commit(0)
    status = sample_status(data.ledger.entries)
    assert set(Counter(c["processed"] for c in status.values())) == {1}
    assert all(c["requeued"] == 1 for c in status.values())
    data.rewind(1)  # nothing drawn since the commit: nothing to rewind
    assert data.ledger.entries[-1]["event"] == "processed"


def test_a_microbatch_retried_within_its_iteration_is_noted_and_still_processed_once(corpus):
    data = HolderShards(corpus, DataLedger(holder="a"))
    data.assign([0], 1, {})
    data.draw([0, 1], iteration=0, epoch=0)
    data.retried(0, 1, 1)  # a relay holding microbatch 1's activations died: its holder ran it again
    data.commit(0)
    status = sample_status(data.ledger.entries)
    assert set(Counter(c["processed"] for c in status.values())) == {1}
    retried = {w for w, c in status.items() if c["retried"]}
    assert retried and len(retried) == len(status) // 2  # microbatch 1's samples, not microbatch 0's


def test_a_shard_handed_over_at_its_committed_position_loses_and_repeats_nothing(corpus):
    carrier, joiner = HolderShards(corpus, DataLedger(holder="a")), HolderShards(corpus, DataLedger(holder="b"))
    carrier.assign([0, 1], 2, {})
    carrier.draw([0, 1], iteration=0, epoch=0)
    carrier.commit(0)
    committed = carrier.positions()
    carrier.draw([0, 1], iteration=1, epoch=0)  # the iteration in progress when the joiner arrives: rerun
    carrier.rewind(1)
    carrier.assign([0], 2, committed)  # it keeps shard 0 as it stands
    joiner.assign([1], 2, committed)  # shard 1 moves at its committed position
    carrier.draw([0], iteration=1, epoch=1)
    joiner.draw([1], iteration=1, epoch=1)
    carrier.commit(1)
    joiner.commit(1)
    status = sample_status(carrier.ledger.entries + joiner.ledger.entries)
    assert set(Counter(c["processed"] for c in status.values())) == {1}
    assert {e["shard"] for e in joiner.ledger.entries if e["event"] == "draw"} == {1}


def test_a_holder_left_out_of_a_commit_has_its_shard_drawn_again_and_nothing_doubles(corpus):
    """A holder dies mid-iteration; the others' draws commit without its own, which stay pending in its ledger;
    a survivor takes its shard over at the position before them. Against the scheduler's commits (each with the
    holders it left out), every sample is processed once: none lost, none doubled."""
    dead, survivor = HolderShards(corpus, DataLedger(holder="a")), HolderShards(corpus, DataLedger(holder="b"))
    dead.assign([0], 2, {})
    survivor.assign([1], 2, {})
    committed_positions = {**dead.positions(), **survivor.positions()}
    dead.draw([0], iteration=0, epoch=0)  # then it dies: no report, nothing more in its ledger
    survivor.draw([1], iteration=0, epoch=0)
    survivor.commit(0)
    committed_positions.update(survivor.positions())  # the commit of iteration 0 counts the survivor's draws only
    survivor.assign([0, 1], 2, committed_positions)  # from iteration 1 it carries the dead holder's shard too
    survivor.draw([0, 1], iteration=1, epoch=1)
    survivor.commit(1)
    entries = dead.ledger.entries + survivor.ledger.entries
    records = [{"iteration": 1, "epoch": 0, "left_out": ["a"]}, {"iteration": 2, "epoch": 1, "left_out": []}]
    status = sample_status(entries, committed(records))
    assert set(Counter(c["processed"] for c in status.values())) == {1}
    assert any(c["pending"] for c in status.values())  # the dead holder's draws, left pending
    # read as if the commit had counted the dead holder's draws, its shard's first samples would count twice
    doubled = sample_status(entries, {(0, 0): (), (1, 1): ()})
    assert set(Counter(c["processed"] for c in doubled.values())) == {1, 2}


def test_a_holder_placed_again_takes_its_old_shard_at_the_committed_position_not_where_it_left_it(corpus):
    """A holder taken for gone while alive (its record expired on a loaded DHT) keeps its shard's state; another
    carries the shard meanwhile; placed again with it, it resumes where the commit says: nothing doubles."""
    back, carrier = HolderShards(corpus, DataLedger(holder="a")), HolderShards(corpus, DataLedger(holder="b"))
    back.assign([0], 1, {})
    back.draw([0], iteration=0, epoch=0)
    back.commit(0)
    carrier.assign([0], 1, back.positions())  # "a" is dropped from iteration 1; "b" carries its shard
    carrier.draw([0], iteration=1, epoch=1)
    carrier.commit(1)
    back.assign([0], 1, carrier.positions(), reload=True)  # "a" is placed again from iteration 2
    back.draw([0], iteration=2, epoch=2)
    back.commit(2)
    status = sample_status(back.ledger.entries + carrier.ledger.entries)
    assert set(Counter(c["processed"] for c in status.values())) == {1}
    stale = HolderShards(corpus, DataLedger(holder="a"))  # without reload, it would resume where it left it
    stale.assign([0], 1, {})
    stale.draw([0], iteration=0, epoch=0)
    stale.commit(0)
    stale.assign([0], 1, carrier.positions())
    stale.draw([0], iteration=2, epoch=2)
    stale.commit(2)
    doubled = sample_status(stale.ledger.entries + carrier.ledger.entries)
    assert 2 in Counter(c["processed"] for c in doubled.values())
