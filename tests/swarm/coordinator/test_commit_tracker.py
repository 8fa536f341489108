"""An iteration commits once every holder of its epoch reported it, those left out of it aside (neither waited for
nor counted); reports of another epoch do not count; the
commit carries the shard positions; the metrics line adds the holders' reports up; holders late against the others'
median report are found once half of the counted holders reported."""

from __future__ import annotations

import pytest

from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.control.messages import Done
from swarm.coordinator.commit_tracker import CommitTracker, iteration_metrics
from swarm.wire import PeerRecord


def holders(names: str, *, idle: str = "", epoch: int = 1) -> Schedule:
    """A 2-stage schedule of epoch `epoch`: each peer of `names` holds data, each outside `idle` injects one
    microbatch through the relay "r"."""
    routes = tuple(Route(microbatch=i, origin=p, stages=(1,), peers=("r",))
                   for i, p in enumerate(p for p in names if p not in idle))
    placement = {**{p: 0 for p in names}, "r": 1}
    return Schedule(epoch=epoch, rules=PathRules(num_stages=2, stages_per_path=2), placement=placement,
                    memory={p: 2 for p in placement}, routes=routes)


def done(peer: str, iteration: int = 3, epoch: int = 1, **kw) -> Done:
    fields = dict(loss_sum=2.0, losses=4, tokens=512, started=100.0, finished=102.0, shards={})
    return Done(peer=peer, iteration=iteration, epoch=epoch, **{**fields, **kw})


def test_an_iteration_commits_when_every_holder_of_its_epoch_reported_it():
    schedule = holders("ab")
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
    schedule = holders("abc")
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
    schedule = holders("ab")
    moved = {"holder": 1, "num_holders": 2, "epoch": 0, "cursor": 8}
    tracker = CommitTracker({"1": {**moved, "cursor": 4}})
    assert "not its own" in tracker.add("a", done("a", shards={"1": moved}), own=["0"])
    assert tracker.add("a", done("a"), own=["0"]) is None
    assert tracker.add("b", done("b", shards={"1": {**moved, "cursor": 99}}), own=[], own_data=True) is None
    commit, _ = tracker.try_commit(3, schedule)
    assert commit.shards == {"1": {**moved, "cursor": 4}}  # neither report moved shard 1


def test_the_late_holders_are_those_counted_and_awaited_and_get_more_patience_the_iteration_after():
    schedule = holders("abcde")
    tracker = CommitTracker()
    tracker.add("a", done("a"), now=110.0)
    tracker.add("b", done("b"), now=110.5)
    tracker.add("c", done("c", iteration=2), now=111.0)  # an older iteration's report
    assert tracker.late(3, schedule, left_out=["e"], started=100.0, now=200.0) == (["c", "d"], pytest.approx(90.0))
    assert tracker.late(3, schedule, left_out=["e"], started=100.0, now=114.0) == ([], 0.0)
    tracker.excuse_late(3, 1, ["c", "d"])
    commit, reports = tracker.try_commit(3, schedule, left_out=["e"])
    assert {r.peer for r in reports} == {"a", "b"} and commit.left_out == ("c", "d", "e")
    # left out for being late, c and d get three times the margin in the next iteration: 3 x max(3, 11 / 2) s
    tracker.add("a", done("a", iteration=4), now=120.0)
    tracker.add("b", done("b", iteration=4), now=121.0)
    tracker.add("e", done("e", iteration=4), now=121.0)
    assert tracker.late(4, schedule, left_out=[], started=110.0, now=137.0) == ([], 0.0)
    assert tracker.late(4, schedule, left_out=[], started=110.0, now=138.0) == (["c", "d"], pytest.approx(17.0))
    tracker.add("c", done("c", iteration=4), now=1001.0)
    tracker.add("d", done("d", iteration=4), now=1001.0)
    assert tracker.try_commit(4, schedule)[0].left_out == ()
    # a report repeated later keeps its first arrival
    tracker.add("a", done("a", iteration=5), now=120.0)
    tracker.add("a", done("a", iteration=5), now=190.0)
    assert tracker.late(5, holders("ab"), left_out=[], started=110.0,
                        now=126.0) == (["b"], pytest.approx(6.0))


def test_a_holder_left_out_late_twice_in_a_row_is_waited_for_the_third_time():
    schedule = holders("ab")
    tracker = CommitTracker()
    started = 0.0
    for iteration, patience in ((0, 1.0), (1, 3.0)):
        tracker.add("a", done("a", iteration=iteration), now=started + 1.0)
        assert tracker.late(iteration, schedule, [], started, now=started + 1.0 + patience * 3.0) == ([], 0.0)
        late, _ = tracker.late(iteration, schedule, [], started, now=started + 1.1 + patience * 3.0)
        assert late == ["b"]
        tracker.excuse_late(iteration, 1, late)
        assert tracker.try_commit(iteration, schedule)[0].left_out == ("b",)
        started += 20.0
    tracker.add("a", done("a", iteration=2), now=started + 1.0)
    assert tracker.late(2, schedule, [], started, now=started + 1000.0) == ([], 0.0)  # the third time it is awaited
    tracker.add("b", done("b", iteration=2), now=started + 1000.0)
    assert tracker.try_commit(2, schedule)[0].left_out == ()
    tracker.add("a", done("a", iteration=3), now=started + 1001.0)  # counted: it starts afresh
    assert tracker.late(3, schedule, [], started + 1000.0, now=started + 1005.0)[0] == ["b"]


def test_a_holder_that_injects_nothing_is_no_yardstick_and_never_commits_an_iteration_alone():
    # a full pipeline of one column: holder a carries every microbatch, b none (its report comes at once)
    schedule = holders("ab", idle="b")
    tracker = CommitTracker()
    tracker.add("b", done("b", losses=0, loss_sum=0.0, tokens=0), now=100.0)
    assert tracker.late(3, schedule, left_out=[], started=100.0, now=1000.0) == ([], 0.0)
    tracker.excuse(3, 1, ["a"])  # a declared gone: the idle holder's empty report commits nothing
    assert tracker.try_commit(3, schedule) is None
    # among injecting holders the rule is unchanged: c is late against a's report, b's does not count
    schedule = holders("abc", idle="b")
    tracker.add("a", done("a", iteration=4), now=110.0)
    tracker.add("b", done("b", iteration=4), now=100.0)
    assert tracker.late(4, schedule, left_out=[], started=100.0, now=113.0) == ([], 0.0)
    assert tracker.late(4, schedule, left_out=[], started=100.0, now=115.1) == (["c"], pytest.approx(5.1))
