"""A peer follows only its scheduler: notices, 'gone', 'finished' and commits from anyone else are ignored, and
the scheduler's would-be successor is trusted only once the scheduler has missed a heartbeat."""

from __future__ import annotations

import threading
import time

from swarm.control.messages import Commit, Finished, Gone, Join, ScheduleNotice
from swarm.events import EVENT_ATTR
from swarm.peer.schedule_follower import ScheduleFollower


def follower() -> ScheduleFollower:
    return ScheduleFollower(records=None, coordinator="coord", heartbeat=1.0)  # the DHT is not read here


def test_only_the_scheduler_is_followed(caplog):
    f = follower()
    for message in (ScheduleNotice(epoch=9), Gone(peers=("x",), iteration=1, epoch=0), Finished(iterations=3, epoch=0),
                    Commit(iteration=1, epoch=0)):
        assert not f.on_message("stranger", message)
    assert not f.notice.is_set() and not f.finished.is_set() and not f.gone and not f.is_committed(1, 0)
    ignored = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert [e["kind"] for e in ignored] == ["ScheduleNotice", "Gone", "Finished", "Commit"]
    assert not f.on_message("coord", Join(peer="coord"))  # not a scheduler's message: nothing to follow
    f.on_message("coord", ScheduleNotice(epoch=2))
    assert f.notice.is_set()
    assert f.on_message("coord", Gone(peers=("x",), iteration=1, epoch=0))
    assert f.on_message("coord", Gone(peers=("y",), iteration=1, epoch=0))
    assert f.gone == {"x", "y"}
    assert f.on_message("coord", Commit(iteration=4, epoch=1, shards={"0": {"holder": 0, "num_holders": 1,
                                                                             "epoch": 0, "cursor": 3}}))
    assert f.is_committed(4, 1) and f.committed_positions[0] == 4
    f.forget_commits_before(5)
    assert not f.is_committed(4, 1)
    assert not f.on_message("coord", Finished(iterations=3, epoch=1))  # replayed: 5 iterations are committed
    assert not f.finished.is_set()
    assert f.on_message("coord", Finished(iterations=5, epoch=1)) and f.finished.is_set()


def test_the_successor_is_trusted_once_the_scheduler_missed_a_heartbeat():
    f = follower()
    f.candidate = "heir"
    assert not f.trusted("heir")
    f.scheduler_seen = time.monotonic() - 2.0  # 1.5 heartbeats without its record
    assert f.trusted("heir") and not f.trusted("stranger") and f.trusted("coord")
    assert not f.scheduler_silent()
    f.scheduler_seen = time.monotonic() - 10.0  # past its record's lifetime and a grace
    assert f.scheduler_silent()


def test_a_scheduler_whose_record_is_missing_but_which_still_commits_is_not_silent():
    f = follower()
    f.scheduler_seen = time.monotonic() - 10.0  # its record unseen past its lifetime (its DHT stores time out)
    assert f.scheduler_silent()
    assert f.on_message("coord", Commit(iteration=0, epoch=0))  # but its signed gossip still comes
    assert not f.scheduler_silent()
    f.scheduler_seen = time.monotonic() - 10.0
    f.on_message("stranger", Commit(iteration=1, epoch=0))  # anyone else's says nothing of it
    assert f.scheduler_silent()
    f.on_message("coord", Commit(iteration=0, epoch=0))  # a replay of its old commit (anyone may re-publish it)
    assert f.scheduler_silent()
    f.on_message("coord", ScheduleNotice(epoch=3))  # news: a newer epoch
    assert not f.scheduler_silent()


def test_waiting_for_a_replacement_ends_when_the_run_finishes():
    """A peer stuck in an iteration when the run ends leaves, instead of waiting out the commit timeout."""
    f = follower()
    assert f.on_message("coord", Finished(iterations=3, epoch=0))
    start = time.monotonic()
    assert not f.wait_for_replacement(3, threading.Event(), timeout=30)
    assert time.monotonic() - start < 1
