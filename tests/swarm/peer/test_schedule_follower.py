"""A peer follows only its scheduler: notices, 'gone', 'finished' and commits from anyone else are ignored, and
the scheduler's would-be successor is trusted only once the scheduler has missed a heartbeat."""

from __future__ import annotations

import threading
import time

from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.control.messages import Alive, Commit, Finished, Gone, Join, ScheduleNotice
from swarm.events import EVENT_ATTR
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.wire import ScheduleMsg


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


def test_a_peer_that_took_the_live_coordinator_for_dead_follows_it_again_at_its_news():
    """One peer's watch missed the coordinator's record past its lifetime (its stores timed out) and moved on to the
    successor; the coordinator lives on and commits, and the other peers follow it."""
    f = follower()
    f.on_message("coord", Commit(iteration=0, epoch=0))
    f.scheduler = "heir"  # as the watch sets it
    assert not f.on_message("coord", Commit(iteration=0, epoch=0))  # a replay says nothing of its being alive
    assert f.scheduler == "heir"
    assert f.on_message("coord", Commit(iteration=1, epoch=0))  # news: it is alive, and this commit is taken
    assert f.scheduler == "coord" and f.is_committed(1, 0) and not f.scheduler_silent()
    f.scheduler = "heir"
    assert not f.on_message("coord", Gone(peers=("x",), iteration=1, epoch=0))  # not news: still the heir's
    assert f.scheduler == "heir" and not f.gone
    f.on_message("coord", ScheduleNotice(epoch=4))
    assert f.scheduler == "coord" and f.notice.is_set()


def test_the_schedulers_beats_keep_it_alive_and_a_replayed_or_stale_beat_does_not(caplog):
    """The scheduler gossips a beat every heartbeat: while beats come, a peer whose reads of the DHT miss the
    scheduler's record does not take it for dead. A beat counts only numbered above every one seen from its sender
    (its sidecar numbers what it publishes, under its signature), and only from a scheduler not behind this peer."""
    f = follower()
    f.on_message("coord", Commit(iteration=3, epoch=1))
    f.scheduler_seen = time.monotonic() - 10.0  # its record unseen past its lifetime
    assert not f.on_message("coord", Alive(epoch=1, iteration=4), seqno=1000)  # nothing for the main loop
    assert not f.scheduler_silent()
    f.scheduler_seen = time.monotonic() - 10.0
    f.on_message("coord", Alive(epoch=1, iteration=4), seqno=1000)  # a replay, re-published by anyone
    f.on_message("coord", Alive(epoch=1, iteration=4), seqno=999)
    f.on_message("stranger", Alive(epoch=1, iteration=4), seqno=5000)  # nobody it follows (and not worth a warning)
    assert f.scheduler_silent()
    f.on_message("coord", Alive(epoch=1, iteration=3), seqno=1001)  # numbered anew, but behind the commit of 3
    assert f.scheduler_silent()
    f.on_message("coord", Alive(epoch=1, iteration=4), seqno=1002)
    assert not f.scheduler_silent()

    f.scheduler = "heir"  # the watch moved on to the successor, which went on to commit 4 and 5
    f.on_message("heir", Commit(iteration=5, epoch=2))
    f.on_message("coord", Alive(epoch=1, iteration=4), seqno=1003)  # the coordinator, unfrozen, is behind
    assert f.scheduler == "heir"
    f.on_message("coord", Alive(epoch=3, iteration=6), seqno=1004)  # it is alive and has caught up
    assert f.scheduler == "coord"
    assert not [r for r in caplog.records if "ignored" in r.getMessage()]  # beats of others pass quietly


def test_waiting_for_a_replacement_ends_when_the_run_finishes():
    """A peer stuck in an iteration when the run ends leaves, instead of waiting out the commit timeout."""
    f = follower()
    assert f.on_message("coord", Finished(iterations=3, epoch=0))
    start = time.monotonic()
    assert not f.wait_for_replacement(3, threading.Event(), timeout=30)
    assert time.monotonic() - start < 1


class NewestSchedule:
    """The DHT as a waiting joiner reads it: the newest schedule (or None), and how many times it was read."""

    def __init__(self) -> None:
        self.reads, self.schedule = 0, None

    def fetch_schedule(self, *, signers):
        self.reads += 1
        return self if self.schedule is not None else None

    def to_schedule(self):
        return self.schedule

    def to_bridge(self):
        return None


class Placement:
    def __init__(self, epoch: int, placement: dict[str, int]) -> None:
        self.epoch, self.placement = epoch, placement


def wait_until(condition, timeout: float) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, "timed out"
        time.sleep(0.02)
    return time.monotonic() - start


def waiting_joiner(dht: NewestSchedule) -> tuple[ScheduleFollower, list, threading.Thread]:
    """A follower waiting to place "me" in a thread of its own (what it is placed by lands in the list), once it has
    read the DHT a first time."""
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    placed: list = []
    waiter = threading.Thread(target=lambda: placed.append(f.wait_for_placement("me", threading.Event(), 30)))
    waiter.start()
    wait_until(lambda: dht.reads == 1, 5)
    return f, placed, waiter


def test_a_peer_waiting_to_be_placed_reads_the_dht_at_a_notice_and_seldom_without_one():
    """Every joiner waits at once, and each read is a DHT lookup: without a notice it reads every
    PLACEMENT_POLL_PERIOD; a notice wakes it, and it reads often for a while in case the DHT lags the notice."""
    dht = NewestSchedule()
    f, placed, waiter = waiting_joiner(dht)
    time.sleep(1.2)
    assert dht.reads == 1  # no notice: no second read yet
    f.on_message("coord", ScheduleNotice(epoch=0))  # announced, but the DHT does not return it yet
    assert wait_until(lambda: dht.reads >= 3, 5) < 1.5  # read at once, and again half a second later
    dht.schedule = Placement(0, {"other": 0})  # an epoch that does not place this peer: it keeps waiting
    time.sleep(0.6)
    assert not placed
    dht.schedule = Placement(1, {"me": 2, "other": 0})
    waiter.join(timeout=5)
    assert placed and placed[0].placement["me"] == 2


class StuckDHT:
    """The DHT with a frozen node on the way: each read of the schedule waits until `release` is set."""

    def __init__(self, schedule) -> None:
        self.schedule, self.release, self.reads = schedule, threading.Event(), 0

    def fetch_schedule(self, *, signers):
        self.reads += 1
        self.release.wait(10)
        return self

    def to_schedule(self):
        return self.schedule

    def to_bridge(self):
        return None


class Epoch(Placement):
    def __init__(self, epoch: int, start_iteration: int) -> None:
        super().__init__(epoch, {"me": 0})
        self.meta = {"start_iteration": start_iteration}


def test_a_read_stuck_on_the_dht_does_not_hold_up_the_pipeline_loop():
    """The pipeline loop asks for a newer epoch between operations (and checks for late backwards there): a read
    that waits on a frozen DHT node runs off that loop, and what it found is taken at a later look."""
    dht = StuckDHT(Epoch(1, start_iteration=7))
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    f.schedule = Epoch(0, start_iteration=0)
    f.on_message("coord", ScheduleNotice(epoch=1))
    start = time.monotonic()
    for _ in range(20):
        assert not f.replaced(7)
    assert time.monotonic() - start < 0.5 and dht.reads == 1  # one read under way, not one per look
    dht.release.set()
    wait_until(lambda: f.replaced(7), 5)
    assert f.newer.epoch == 1 and not f.replaced(6)


def test_at_an_iteration_start_a_read_of_an_announced_epoch_is_waited_for_a_moment():
    dht = StuckDHT(Epoch(1, start_iteration=7))
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    f.schedule = Epoch(0, start_iteration=0)
    f.on_message("coord", ScheduleNotice(epoch=1))
    threading.Timer(0.3, dht.release.set).start()
    start = time.monotonic()
    due = f.due(7)  # the read ends while `due` waits: the iteration starts under the new epoch
    assert due is not None and due.epoch == 1 and time.monotonic() - start < 1.0
    f.schedule = due
    assert f.newer is None


class OneRecord:
    """The DHT's schedule record as the scheduler last stored it (a real `ScheduleMsg`, read back from msgpack)."""

    def __init__(self) -> None:
        self.stored: bytes | None = None

    def store(self, schedule: Schedule, bridge: Schedule | None = None) -> None:
        self.stored = ScheduleMsg.from_schedule(schedule, bridge).to_msgpack()

    def fetch_schedule(self, *, signers):
        return ScheduleMsg.from_msgpack(self.stored) if self.stored is not None else None


def real_epoch(epoch: int, start_iteration: int) -> Schedule:
    route = Route(microbatch=0, origin="me", stages=(1,), peers=("relay",))
    return Schedule(epoch=epoch, rules=PathRules(num_stages=2, stages_per_path=2), placement={"me": 0, "relay": 1},
                    memory={"me": 2, "relay": 2}, routes=(route,), meta={"start_iteration": start_iteration})


def test_an_epoch_replaced_in_the_dht_before_this_peer_read_it_is_taken_from_its_bridge():
    """Epoch 7 starts at iteration 66; epoch 8, planned during 66, starts at 67 and replaces it in the DHT. A peer
    still on epoch 6 runs 66 under epoch 7 (what the others run), then 67 under epoch 8."""
    dht = OneRecord()
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    f.schedule = real_epoch(6, start_iteration=55)
    dht.store(real_epoch(8, start_iteration=67), bridge=real_epoch(7, start_iteration=66))
    f.on_message("coord", ScheduleNotice(epoch=8))
    taken = f.due(66)
    assert taken.epoch == 7 and [s.epoch for s in f.pending] == [7, 8]  # pending until used: the checks know it
    f.schedule = taken
    assert [s.epoch for s in f.pending] == [8] and not f.replaced(66) and f.due(66) is None
    f.schedule = f.due(67)
    assert f.schedule.epoch == 8 and f.pending == ()


def following(*records: tuple[Schedule, Schedule | None]) -> ScheduleFollower:
    """A follower on epoch 6 (from iteration 55) that read each (newest, bridge) record in turn, as the DHT held it."""
    dht = OneRecord()
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    f.schedule = real_epoch(6, start_iteration=55)
    for newest, bridge in records:
        dht.store(newest, bridge=bridge)
        f.on_message("coord", ScheduleNotice(epoch=newest.epoch))
        f.poll_newer(wait=5)
    return f


EPOCH_8_BRIDGING_7 = (real_epoch(8, start_iteration=67), real_epoch(7, start_iteration=66))


def test_a_peer_an_iteration_behind_keeps_every_bridge_it_read_until_each_starts():
    """Still on epoch 6 in iteration 66, a peer reads epoch 8 (from 67) bridging to 7 (from 66), then epoch 9 (from
    68) bridging to 8: it runs 66 under 7, 67 under 8 and 68 under 9, as the others did."""
    f = following(EPOCH_8_BRIDGING_7, (real_epoch(9, start_iteration=68), real_epoch(8, start_iteration=67)))
    assert [s.epoch for s in f.pending] == [7, 8, 9] and f.replaced(66)
    taken = []
    for i in (66, 67, 68):
        f.schedule = f.due(i)
        taken.append(f.schedule.epoch)
    assert taken == [7, 8, 9] and f.pending == ()


def test_a_newer_epoch_read_before_is_kept_as_the_bridge_of_one_that_replaced_it_in_the_dht():
    """Still in iteration 66 on epoch 6, a peer holds bridge 7 (from 66) and newer 8 (from 67). Epochs 9 (from 68,
    bridging to 8) and 10 (from 69, bridging to 9) follow; it reads only 10. It still runs 67 under 8."""
    f = following(EPOCH_8_BRIDGING_7, (real_epoch(10, start_iteration=69), real_epoch(9, start_iteration=68)))
    assert [s.epoch for s in f.pending] == [7, 8, 9, 10]


def test_the_epoch_being_taken_stays_known_to_other_threads_until_it_is_in_use():
    """The inbound checks (another thread) read one snapshot of the known epochs: between `due` and the epoch's use
    it is still there, and once in use the epochs before it are gone."""
    f = following(EPOCH_8_BRIDGING_7)
    taken = f.due(66)
    assert [s.epoch for s in f.known.all] == [6, 7, 8]
    f.schedule = taken
    assert [s.epoch for s in f.known.all] == [7, 8]


def test_a_rerun_from_a_bridges_start_replaces_that_bridge():
    """Epoch 9 reruns iteration 66 (it starts there): the bridge that also started at 66 is not run."""
    f = following(EPOCH_8_BRIDGING_7, (real_epoch(9, start_iteration=66), None))
    assert [s.epoch for s in f.pending] == [9] and f.due(66).epoch == 9


def test_a_peer_that_read_the_bridged_epoch_already_takes_the_newest_where_it_starts():
    """The bridge of a record read again is older than the epoch in use: it is not taken a second time."""
    dht = OneRecord()
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    f.schedule = real_epoch(7, start_iteration=66)
    dht.store(real_epoch(8, start_iteration=67), bridge=real_epoch(7, start_iteration=66))
    f.on_message("coord", ScheduleNotice(epoch=8))
    assert f.due(66) is None and [s.epoch for s in f.pending] == [8] and f.replaced(67)


class CountingRecord(OneRecord):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def fetch_schedule(self, *, signers):
        self.reads += 1
        return super().fetch_schedule(signers=signers)


def test_a_peer_awaiting_the_replacement_of_an_iteration_reads_often_until_it_is_read():
    """A holder whose microbatch cannot be re-queued reports it; the scheduler's notice of the rerun may be lost,
    or this peer may be the one behind. It reads every LAGGING_POLL_PERIOD, not every SCHEDULE_POLL_PERIOD."""
    dht = CountingRecord()
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    f.schedule = real_epoch(6, start_iteration=55)
    dht.store(real_epoch(6, start_iteration=55))

    def reads_within(seconds: float, iteration: int) -> int:
        before, end = dht.reads, time.monotonic() + seconds
        while time.monotonic() < end:
            f.replaced(iteration)
            time.sleep(0.05)
        return dht.reads - before

    f.replaced(66)  # the first look reads at once
    assert reads_within(1.3, 66) == 0  # nothing awaited, nothing announced: the slow cadence
    f.await_replacement(66)
    assert reads_within(1.3, 66) >= 2
    dht.store(real_epoch(7, start_iteration=67))  # an epoch that does not replace iteration 66: still awaited
    assert reads_within(1.3, 66) >= 2 and not f.replaced(66)
    dht.store(real_epoch(8, start_iteration=66))
    wait_until(lambda: f.replaced(66), 2)
    assert reads_within(1.3, 66) == 0  # read: no more reads at the lagging cadence


def test_a_joiner_placed_by_the_bridged_epoch_starts_there_and_keeps_the_newest_pending():
    """A joiner placed by epoch 7 (from iteration 66), replaced in the DHT by epoch 8 (from 67) before it read it: the
    others run 66 with it under epoch 7, so it starts there."""
    dht = OneRecord()
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    dht.store(real_epoch(8, start_iteration=67), bridge=real_epoch(7, start_iteration=66))
    placed = f.wait_for_placement("me", threading.Event(), 5)
    assert placed.epoch == 7 and [s.epoch for s in f.pending] == [8]
    f.schedule = placed
    f.drop_pending(through=placed.epoch)  # as a peer starting on it does: the newest stays pending
    assert f.due(66) is None and f.due(67).epoch == 8
    assert f.wait_for_placement("me", threading.Event(), 5, newer_than=7).epoch == 8  # placed again, after 7
    assert f.wait_for_placement("stranger", threading.Event(), 0.1) is None


def test_a_peer_declared_gone_under_an_epoch_stays_gone_when_that_epoch_is_taken():
    """The relay died after epoch 3 was planned (declared gone under it): a peer taking epoch 3 late still goes
    around it and stops waiting for its state; a later epoch that places it (it rejoined) brings it back."""
    f = follower()
    f.on_message("coord", Gone(peers=("relay",), iteration=5, epoch=3))
    f.placed_anew(real_epoch(3, 5))
    assert f.gone == {"relay"}
    f.placed_anew(real_epoch(4, 7))
    assert f.gone == frozenset()


def carrying(schedule: Schedule, bridge: Schedule | None = None) -> ScheduleNotice:
    return ScheduleNotice.of(ScheduleMsg.from_schedule(schedule, bridge))


def test_an_epoch_its_notice_carries_is_taken_without_waiting_for_the_dht():
    """The scheduler's notice carries epoch 8 (bridging to 7) while its store is under way and the DHT holds epoch 6:
    the peer runs 66 under 7 and 67 under 8 without a read bringing them; a replayed notice of an older epoch
    changes nothing."""
    dht = CountingRecord()
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    f.schedule = real_epoch(6, start_iteration=55)
    dht.store(real_epoch(6, start_iteration=55))
    f.on_message("coord", carrying(*EPOCH_8_BRIDGING_7))
    start = time.monotonic()
    assert f.replaced(66) and [s.epoch for s in f.pending] == [7, 8]
    f.schedule = f.due(66)
    assert f.schedule.epoch == 7 and time.monotonic() - start < 0.5
    f.on_message("coord", carrying(real_epoch(5, start_iteration=50)))
    assert f.due(67).epoch == 8


def test_an_epoch_carried_by_a_stranger_or_malformed_is_not_taken(caplog):
    """Only the scheduler's notices are taken; one whose epoch is malformed, or not the epoch it announces, is
    dropped with a reason, and the DHT is read instead."""
    dht = OneRecord()
    f = ScheduleFollower(records=dht, coordinator="coord", heartbeat=1.0)
    f.schedule = real_epoch(6, start_iteration=55)
    f.on_message("stranger", carrying(real_epoch(9, start_iteration=56)))
    assert f.due(56) is None and not f.pending
    forged = ScheduleNotice(epoch=10, schedule=ScheduleMsg.from_schedule(real_epoch(9, 56)).to_msgpack())
    for notice in (ScheduleNotice(epoch=9, schedule=b"\x81\xa3not a schedule"), forged):
        f.on_message("coord", notice)
        assert f.due(56) is None and not f.pending
    whys = [getattr(r, EVENT_ATTR)["why"] for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert whys[0] == "not the run's scheduler" and "the epoch carried: malformed" in whys[1]
    assert "announces epoch 10" in whys[2]
    dht.store(real_epoch(10, start_iteration=56))  # the store lands: the next read brings it
    wait_until(lambda: f.due(56) is not None, 5)
    assert f.due(56).epoch == 10


def test_a_joiner_takes_the_epoch_placing_it_from_the_notice():
    f, placed, waiter = waiting_joiner(NewestSchedule())
    f.on_message("coord", carrying(real_epoch(3, start_iteration=20)))  # the DHT has nothing yet
    waiter.join(timeout=5)
    assert placed and placed[0].epoch == 3 and placed[0].placement["me"] == 0


def test_epochs_carried_by_two_notices_before_a_look_are_both_kept():
    """Epoch 7 (from iteration 66) and epoch 8 (from 67) come in two notices between two looks: 66 runs under 7."""
    f = ScheduleFollower(records=OneRecord(), coordinator="coord", heartbeat=1.0)
    f.schedule = real_epoch(6, start_iteration=55)
    f.on_message("coord", carrying(real_epoch(7, start_iteration=66)))
    f.on_message("coord", carrying(real_epoch(8, start_iteration=67)))
    assert [s.epoch for s in f.pending] == [] and f.due(66).epoch == 7 and [s.epoch for s in f.pending] == [7, 8]
