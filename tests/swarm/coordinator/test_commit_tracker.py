"""An iteration commits once every holder of its epoch reported it, those left out of it aside (neither waited for
nor counted); reports of another epoch do not count; the
commit carries the shard positions; the metrics line adds the holders' reports up."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from swarm.control.messages import Done
from swarm.coordinator.commit_tracker import CommitTracker, iteration_metrics
from swarm.wire import PeerRecord


def done(peer: str, iteration: int = 3, epoch: int = 1, **kw) -> Done:
    fields = dict(loss_sum=2.0, losses=4, tokens=512, started=100.0, finished=102.0, shards={})
    return Done(peer=peer, iteration=iteration, epoch=epoch, **{**fields, **kw})


def test_an_iteration_commits_when_every_holder_of_its_epoch_reported_it():
    schedule = SimpleNamespace(epoch=1, data_holders=["a", "b"])
    tracker = CommitTracker({"0": {"holder": 0, "num_holders": 2, "epoch": 0, "cursor": 4}})
    tracker.add("a", done("a", shards={"0": {"holder": 0, "num_holders": 2, "epoch": 0, "cursor": 8}}))
    tracker.add("b", done("b", epoch=0))  # under an epoch that no longer runs this iteration
    assert tracker.try_commit(3, schedule) is None
    tracker.add("b", done("b", shards={"1": {"holder": 1, "num_holders": 2, "epoch": 0, "cursor": 8}}))
    commit, reports = tracker.try_commit(3, schedule)
    assert (commit.iteration, commit.epoch) == (3, 1) and {r.peer for r in reports} == {"a", "b"}
    assert commit.shards == {"0": {"holder": 0, "num_holders": 2, "epoch": 0, "cursor": 8},
                             "1": {"holder": 1, "num_holders": 2, "epoch": 0, "cursor": 8}}
    assert tracker.try_commit(3, schedule) is None  # its reports are spent


def test_the_metrics_line_adds_the_holders_reports_up():
    reports = [done("a", loss_sum=3.0, losses=4, tokens=100, started=10.0, finished=11.0),
               done("b", loss_sum=1.0, losses=4, tokens=300, started=10.5, finished=12.0)]
    peers = {"a": PeerRecord(peer_id="a", stage=0, seconds_per_layer=0.1, memory_slots=3,
                             jitter=tuple(0.001 * i for i in range(16)))}
    line = iteration_metrics(3, reports, epoch=1, peers_online=5, records=peers)
    assert line["iteration"] == 4 and line["loss"] == pytest.approx(0.5) and line["iteration_seconds"] == 2.0
    assert line["tokens_per_s"] == 200.0 and line["peers_online"] == 5 and line["epoch"] == 1
    assert len(line["jitter_ms"]) == 16


def test_a_holder_left_out_is_neither_waited_for_nor_counted_and_the_commit_names_it():
    schedule = SimpleNamespace(epoch=1, data_holders=["a", "b", "c"], placement={"a": 0, "b": 0, "c": 0, "r": 1})
    start = {"holder": 1, "num_holders": 3, "epoch": 0, "cursor": 4}
    tracker = CommitTracker({"1": start})
    tracker.add("a", done("a"))
    tracker.add("b", done("b", shards={"1": {**start, "cursor": 8}}))  # reported, then taken for gone
    assert tracker.try_commit(3, schedule) is None  # c has not reported
    tracker.excuse(3, 1, ["c"])
    tracker.excuse(4, 1, ["a"])  # another iteration's excuse does not count for this one
    commit, reports = tracker.try_commit(3, schedule, left_out=["b", "r"])
    assert {r.peer for r in reports} == {"a"} and commit.left_out == ("b", "c", "r")
    assert commit.shards == {"1": start}  # b's draws are not counted: its shard is drawn again from where it was
    # with every holder left out, nothing commits (the iteration has to run again)
    tracker.add("a", done("a", iteration=4))
    assert tracker.try_commit(4, schedule, left_out=["b", "c"]) is None


def test_a_report_moving_another_holders_shard_is_refused_and_own_documents_move_none():
    schedule = SimpleNamespace(epoch=1, data_holders=["a", "b"], placement={"a": 0, "b": 0})
    moved = {"holder": 1, "num_holders": 2, "epoch": 0, "cursor": 8}
    tracker = CommitTracker({"1": {**moved, "cursor": 4}})
    assert "not its own" in tracker.add("a", done("a", shards={"1": moved}), own=["0"])
    assert tracker.add("a", done("a"), own=["0"]) is None
    assert tracker.add("b", done("b", shards={"1": {**moved, "cursor": 99}}), own=[], own_data=True) is None
    commit, _ = tracker.try_commit(3, schedule)
    assert commit.shards == {"1": {**moved, "cursor": 4}}  # neither report moved shard 1
