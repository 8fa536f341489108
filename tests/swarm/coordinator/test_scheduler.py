"""The scheduler's decisions: the first plan, re-plans on membership changes, reruns on reports, commits.

Driven through its public entry points (`observe` a read of the peers' records, `handle` a control message) with
explicit times; each asserts on the actions it returns for its owner to carry out."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.schedule import Schedule, validate
from swarm.control.messages import (
    Broken,
    Commit,
    Done,
    Finished,
    Gone,
    Ping,
    SitOut,
    Stuck,
    Unreachable,
    Unrecoverable,
)
from swarm.coordinator.actions import Announce, PublishSchedule, RecordIteration
from swarm.coordinator.first_plan import LINK_WAIT_SECONDS, SETTLE_SECONDS
from swarm.coordinator.liveness import FIRST_REJOIN_COOLDOWN
from swarm.coordinator.plan_desk import REPLAN_RETRY_SECONDS
from swarm.coordinator.restart_reports import MIN_STUCK_SECONDS
from swarm.coordinator.scheduler import Scheduler
from swarm.events import EVENT_ATTR
from swarm.wire import PeerRecord, PeerState, ScheduleMsg
from tests.swarm.coordinator.conftest import STAGES, make_replanner, make_scheduler, read_after_expiry

LATER = 20.0
"""Past the lifetime of a record (three heartbeats of 2 s and a grace): a peer unseen this long, that did not answer
the scheduler's ping, is gone (`read_after_expiry`)."""


def fresh(peers: dict[str, PeerRecord], age: float = 0.5) -> dict[str, tuple[PeerRecord, float]]:
    return {p: (r, age) for p, r in peers.items()}


def published(actions: list) -> list[Schedule]:
    return [a.schedule for a in actions if isinstance(a, PublishSchedule)]


def notices(actions: list) -> list:
    """What `actions` announce, pings aside (tests/swarm/coordinator/test_pings.py covers those)."""
    return [a.message for a in actions if isinstance(a, Announce) and not isinstance(a.message, Ping)]


def planned(s: Scheduler, peers: dict[str, PeerRecord], now: float = 0.0) -> Schedule:
    """`s`'s first epoch for `peers` (every link measured): planned once they have settled."""
    assert s.observe(fresh(peers), now) == []
    (schedule,) = published(s.observe(fresh(peers), now + SETTLE_SECONDS))
    return schedule


def commit(s: Scheduler, iterations: int, now: float = 0.0) -> list:
    """Every holder of the epoch in force reports the iteration in progress done, `iterations` times."""
    actions = []
    for _ in range(iterations):
        running = s.epochs.in_force(s.completed)
        for h in running.data_holders:
            actions = s.handle(h, Done(peer=h, iteration=s.completed, epoch=running.epoch, loss_sum=2.0, losses=4,
                                       tokens=256, started=100.0, finished=101.0), now)
    return actions


def test_an_iteration_commits_once_every_holder_of_its_epoch_reported_it(records):
    s = make_scheduler()
    schedule = planned(s, records)
    *first, last = schedule.data_holders
    for h in first:
        assert s.handle(h, Done(peer=h, iteration=0, epoch=0, loss_sum=1.0, losses=2, tokens=100, started=10.0,
                                finished=11.0), 3.0) == []
    assert s.handle("stranger", Done(peer="stranger", iteration=0, epoch=0, loss_sum=1.0, losses=2, tokens=100,
                                     started=10.0, finished=11.0), 3.0) == []
    assert s.handle(first[0], Done(peer=last, iteration=0, epoch=0, loss_sum=1.0, losses=2, tokens=100,
                                   started=10.0, finished=11.0), 3.0) == []  # in another holder's name
    mine, theirs = str(schedule.meta["shards"][last][0]), str(schedule.meta["shards"][first[0]][0])
    position = {"holder": 0, "num_holders": 3, "epoch": 0, "cursor": 8}
    # a holder reports the position of its own shards only: moving another holder's is refused
    assert s.handle(last, Done(peer=last, iteration=0, epoch=0, loss_sum=1.0, losses=2, tokens=100, started=10.5,
                               finished=12.0, shards={theirs: position}), 3.0) == []
    actions = s.handle(last, Done(peer=last, iteration=0, epoch=0, loss_sum=1.0, losses=2, tokens=100,
                                  started=10.5, finished=12.0, shards={mine: position}), 3.0)
    (commit_msg,) = notices(actions)
    assert commit_msg == Commit(iteration=0, epoch=0, shards={mine: position})
    (line,) = [a.record for a in actions if isinstance(a, RecordIteration)]
    # written before it is announced: a scheduler killed in between leaves a record its successor's rerun
    # supersedes, never a commit the peers acted on without a record
    kinds = [type(a.message if isinstance(a, Announce) else a) for a in actions]
    assert kinds.index(RecordIteration) < kinds.index(Commit)
    holders = len(schedule.data_holders)
    assert line["iteration"] == 1 and line["loss"] == pytest.approx(0.5) and line["iteration_seconds"] == 2.0
    assert line["tokens_per_s"] == pytest.approx(100 * holders / 2.0) and line["peers_online"] == len(records)
    assert s.completed == 1


def test_a_gone_relay_or_holder_replans_from_the_next_iteration_and_an_unrecoverable_one_from_this(records):
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 3)
    relay = next(p for p, st in first.placement.items() if st == 2)
    live = {p: r for p, r in records.items() if p != relay}
    actions = read_after_expiry(s, live, LATER)
    # the iteration in progress goes on with detours around the relay; peers are told it is gone
    (new,) = published(actions)
    assert new.meta["start_iteration"] == 4 and relay not in new.placement
    assert Gone(peers=(relay,), iteration=3, epoch=0) in notices(actions)
    # a microbatch it held cannot finish: its holder re-queues it, the iteration goes on
    member = next(p for p in live if p in first.placement)
    assert published(s.handle(member, Broken(peer=member, iteration=3, epoch=0, microbatch=1, attempt=0,
                                              gone=relay), LATER)) == []
    # a holder that cannot re-queue one: that iteration runs again, under an epoch without the relay
    (rerun,) = published(s.handle(member, Unrecoverable(peer=member, iteration=3, epoch=0, microbatch=1), LATER))
    assert rerun.meta["start_iteration"] == 3 and rerun.epoch == 2 and relay not in rerun.placement
    holder = rerun.data_holders[0]
    live = {p: r for p, r in live.items() if p != holder}
    (again,) = published(read_after_expiry(s, live, 2 * LATER))
    # the other holders' microbatches finish without it: the iteration in progress commits without its share
    assert again.meta["start_iteration"] == 4 and holder not in again.placement
    (commit_msg,) = [m for m in notices(commit(s, 1, 2 * LATER)) if isinstance(m, Commit)]
    assert (commit_msg.iteration, commit_msg.epoch) == (3, 2) and holder in commit_msg.left_out


def test_a_gone_holder_is_left_out_of_the_commit_of_the_iteration_in_progress(records):
    """A holder dies while the others finish: the iteration commits without its draws, at once if every other
    holder has reported it already, and its shard is drawn on from where the last commit left it. A report it
    sends after it was taken for gone (it was alive after all) is not counted."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 3)
    dead, *others = first.data_holders
    shard = str(first.meta["shards"][dead][0])
    before = s.commits.shard_positions.get(shard)
    for h in others:
        assert s.handle(h, Done(peer=h, iteration=3, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=100.0,
                                finished=101.0), 5.0) == []
    actions = read_after_expiry(s, {p: r for p, r in records.items() if p != dead}, LATER)
    (new,) = published(actions)
    assert new.meta["start_iteration"] == 4 and dead not in new.placement
    assert any(shard in map(str, new.meta["shards"][h]) for h in new.data_holders)  # taken over
    (commit_msg,) = [m for m in notices(actions) if isinstance(m, Commit)]
    assert (commit_msg.iteration, commit_msg.epoch) == (3, 0) and commit_msg.left_out == (dead,)
    assert commit_msg.shards.get(shard) == before and s.completed == 4
    (line,) = [a.record for a in actions if isinstance(a, RecordIteration)]
    assert line["tokens_per_s"] == pytest.approx(256 * len(others) / 1.0)  # the counted holders' tokens only
    assert line["left_out"] == [dead]  # the ground truth a ledger audit reads (`peers.data_ledger.committed`)
    # its late report of the committed iteration is not counted, nor does it commit the next one
    moved = {"holder": 0, "num_holders": 3, "epoch": 0, "cursor": 99}
    assert s.handle(dead, Done(peer=dead, iteration=3, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=100.0,
                               finished=101.0, shards={shard: moved}), LATER) == []
    assert s.completed == 4 and s.commits.shard_positions.get(shard) == before


def test_a_holder_late_against_the_others_is_left_out_of_the_commit_but_stays_in_the_run(records, caplog):
    """The others reported 10 s into the iteration; one holder has not (frozen, or its microbatches went around a
    dead relay): past max(3 s, half of 10 s) behind them, the iteration commits without its draws. It is not taken
    for gone: no epoch, no notice, and the next iteration is three times as patient with it (a holder always slower
    than the others still has every other iteration counted)."""
    s = make_scheduler("skippipe")
    schedule = planned(s, records)
    commit(s, 1, now=100.0)  # iteration 1 starts at 100 s
    late, *others = schedule.data_holders
    for h in others:
        assert s.handle(h, Done(peer=h, iteration=1, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=100.0,
                                finished=110.0), 110.0) == []
    assert s.check_late_holders(114.0) == []
    with caplog.at_level("WARNING"):
        actions = s.check_late_holders(116.0)
    (commit_msg,) = notices(actions)
    assert commit_msg == Commit(iteration=1, epoch=0, shards=commit_msg.shards, left_out=(late,))
    assert published(actions) == [] and s.completed == 2 and late not in s.liveness.declared_gone
    (excused,) = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert excused["event"] == "holders_excused" and excused["peers"] == [late] and excused["seconds"] == 6.0
    # its report of the committed iteration is not counted; the next iteration waits for it
    assert s.handle(late, Done(peer=late, iteration=1, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=100.0,
                               finished=117.0), 117.0) == []
    for h in others:
        s.handle(h, Done(peer=h, iteration=2, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=117.0,
                         finished=118.0), 118.0)
    # the others came 2 s into iteration 2 (from 116 s): it has 3 x max(3, 1) = 9 s past that, not 3
    assert s.check_late_holders(126.5) == [] and s.completed == 2
    (again,) = [m for m in notices(s.handle(late, Done(peer=late, iteration=2, epoch=0, loss_sum=2.0, losses=4,
                                                        tokens=256, started=117.0, finished=126.8), 126.8))]
    assert again.iteration == 2 and again.left_out == () and s.completed == 3
    # counted once, it is left out as soon as anyone again
    for h in others:
        s.handle(h, Done(peer=h, iteration=3, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=127.0,
                         finished=128.0), 128.0)
    (third,) = notices(s.check_late_holders(131.9))
    assert third.iteration == 3 and third.left_out == (late,)


def test_a_full_pipeline_holder_outside_its_column_neither_excuses_the_one_injecting_nor_commits_alone(records):
    """11 peers: the full pipeline's last stage has one peer, so one column, and one of the two holders injects
    every microbatch. The idle one's empty report comes at once: it is no yardstick for lateness (the injecting
    holder is waited for), and when the injecting holder dies the iteration runs again rather than committing no
    work (a loss of 0 and a step on nothing)."""
    s = make_scheduler("full-pipeline")
    schedule = planned(s, {p: r for p, r in records.items() if p != "peer-11"})
    (injecting,) = {r.origin for r in schedule.routes}
    (idle,) = set(schedule.data_holders) - {injecting}
    commit(s, 1, now=100.0)
    assert s.handle(idle, Done(peer=idle, iteration=1, epoch=0, loss_sum=0.0, losses=0, tokens=0, started=100.0,
                               finished=100.0), 100.0) == []
    assert s.check_late_holders(200.0) == [] and s.completed == 1
    (line,) = [a.record for a in s.handle(injecting, Done(peer=injecting, iteration=1, epoch=0, loss_sum=8.0,
                                                          losses=4, tokens=256, started=100.0, finished=201.0),
                                          201.0) if isinstance(a, RecordIteration)]
    assert line["loss"] == 2.0 and line["left_out"] == [] and s.completed == 2
    s.handle(idle, Done(peer=idle, iteration=2, epoch=0, loss_sum=0.0, losses=0, tokens=0, started=201.0,
                        finished=201.0), 201.0)
    live = {p: r for p, r in records.items() if p not in ("peer-11", injecting)}
    actions = read_after_expiry(s, live, 201.0 + LATER)
    (new,) = published(actions)
    assert new.meta["start_iteration"] == 2 and s.completed == 2  # iteration 2 runs again, under the new epoch
    assert not [a for a in actions if isinstance(a, RecordIteration)]


def test_an_epoch_that_only_started_at_the_iteration_in_progress_goes_along_with_the_one_replacing_it(records):
    """The DHT keeps one schedule per signer: epoch 1 starts at iteration 4, and a change during iteration 4 plans
    epoch 2 from 5. A peer that had not read epoch 1 yet would find only epoch 2 and run iteration 4 under epoch 0,
    which every peer that took epoch 1 refuses (a churn benchmark run stalled 90 s on it): epoch 1 goes along."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 3)
    a, b = [p for p in first.placement if p not in first.data_holders][:2]
    (publish,) = [x for x in read_after_expiry(s, {p: r for p, r in records.items() if p != a}, LATER)
                  if isinstance(x, PublishSchedule)]
    assert publish.schedule.meta["start_iteration"] == 4 and publish.bridge is None  # epoch 0 began long ago
    commit(s, 1, LATER)
    (publish,) = [x for x in read_after_expiry(s, {p: r for p, r in records.items() if p not in (a, b)}, 2 * LATER)
                  if isinstance(x, PublishSchedule)]
    assert publish.schedule.meta["start_iteration"] == 5 and publish.bridge.epoch == 1
    back = ScheduleMsg.from_msgpack(ScheduleMsg.from_schedule(publish.schedule, publish.bridge).to_msgpack())
    assert back.to_bridge() == publish.bridge and back.epoch == 2
    # a holder's death during iteration 4 too: epoch 1 still runs it, and goes along with the newest again
    holder = publish.schedule.data_holders[0]
    (publish,) = [x for x in read_after_expiry(s, {p: r for p, r in records.items() if p not in (a, b, holder)},
                                               3 * LATER) if isinstance(x, PublishSchedule)]
    assert publish.schedule.meta["start_iteration"] == 5 and publish.bridge.epoch == 1
    # a rerun of the iteration in progress replaces the epoch running it outright: nothing to bridge
    member = publish.schedule.data_holders[0]
    (rerun,) = [x for x in s.handle(member, Unrecoverable(peer=member, iteration=4, epoch=1, microbatch=1),
                                    3 * LATER) if isinstance(x, PublishSchedule)]
    assert rerun.schedule.meta["start_iteration"] == 4 and rerun.bridge is None


def test_a_lone_unrecoverable_report_then_a_gone_peer_of_its_epoch_rerun_the_iteration_in_progress(records):
    """A holder cannot re-queue a microbatch (its stage's only peer died; no detour), reported before the dead peer's
    record expired: too early to believe alone. The peer then found gone corroborates it: the new epoch reruns the
    iteration in progress instead of starting after it (which would leave it to hang until its deadline)."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 3)
    relay = next(p for p, st in first.placement.items() if st == 2)
    member = next(p for p in first.placement if p != relay)
    assert published(s.handle(member, Unrecoverable(peer=member, iteration=3, epoch=0, microbatch=1), 1.0)) == []
    (new,) = published(read_after_expiry(s, {p: r for p, r in records.items() if p != relay}, LATER))
    assert new.meta["start_iteration"] == 3 and relay not in new.placement
    # its later reports of that iteration under the old epoch restart nothing more
    assert published(s.handle(member, Unrecoverable(peer=member, iteration=3, epoch=0, microbatch=2), LATER)) == []


def test_a_stuck_report_restarts_the_iteration_once_corroborated_under_a_new_epoch(records):
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 3)  # committed at t=0; iterations take 1 s
    member, other = list(first.placement)[:2]

    def stuck(sender: str, iteration: int, epoch: int, now: float = 5.0) -> list[Schedule]:
        return published(s.handle(sender, Stuck(peer=sender, iteration=iteration, epoch=epoch), now))

    assert stuck("stranger", 3, 0) == []  # not a peer of the schedule
    assert stuck(member, 2, 0) == []  # an iteration already committed
    assert stuck(member, 3, 0) == [] and stuck(member, 3, 0) == []  # one peer alone, 5 s in: not believed yet
    (restart,) = stuck(other, 3, 0)  # a second peer reports it: corroborated
    assert stuck(other, 3, 0) == [] and stuck(member, 3, 0) == []  # one restart
    assert restart.epoch == 1 and restart.meta["start_iteration"] == 3
    assert restart.placement == first.placement  # the same peers, nobody moved
    # still stuck under the new epoch: a lone report is believed once the iteration has run far too long...
    assert stuck(member, 3, 1, now=6.0) == []
    late = 5.0 + MIN_STUCK_SECONDS + 1
    assert published(s.observe(fresh(records), late)) == []  # everyone is still there
    (again,) = stuck(member, 3, 1, now=late)
    assert again.epoch == 2
    # ...but the same peer alone is not believed again for a while
    assert published(s.observe(fresh(records), 100.0)) == [] and stuck(member, 3, 2, now=100.0) == []


def test_corroborated_unreachable_reports_declare_a_peer_gone_before_its_record_expires(records):
    s = make_scheduler("skippipe")
    first = planned(s, records)
    ages = dict.fromkeys(records, 1.0)  # every heartbeat fresh (period 2 s)
    read = lambda: {p: (r, ages[p]) for p, r in records.items()}  # noqa: E731
    relay, a, b = [p for p, st in first.placement.items() if st != 0][:3]
    s.handle(a, Unreachable(peer=relay), 3.0)  # one report while its heartbeat is fresh: one broken link is no proof
    s.handle("stranger", Unreachable(peer=relay), 3.0)  # not a peer of the schedule: does not count
    assert relay in s.liveness.update(read(), 3.0)
    ages[relay] = 4.5  # one beat missed (a store that failed): not overdue yet
    assert relay in s.liveness.update(read(), 3.0)
    ages[relay] = 5.5  # its heartbeat is now overdue (past 2.5 periods of 2 s): the report stands corroborated
    assert relay not in s.liveness.update(read(), 3.0)
    records[relay] = dataclasses.replace(records[relay], state=PeerState.JOINING)
    ages[relay] = 1.0
    assert relay not in s.liveness.update(read(), 3.0)  # alive after all, asks to be placed again: not at once
    back = 3.0 + FIRST_REJOIN_COOLDOWN
    assert relay in s.liveness.update(read(), back)  # taken back once its cool-down has passed
    s.handle(a, Unreachable(peer=b), back)
    s.handle(relay, Unreachable(peer=b), back)  # two reporters: gone at once, whatever its heartbeat says
    assert b not in s.liveness.live(back)


def test_a_lone_stages_peer_leaving_gracefully_is_replaced_by_a_moved_peer_without_any_detour(records):
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 3)
    peers, now = records, LATER
    lone = next((p for p, st in first.placement.items() if st > 0 and len(first.stage_peers(st)) == 1), None)
    if lone is None:  # make one: every other peer of some stage leaves first (plain departures)
        stage = max(range(1, STAGES), key=lambda st: -len(first.stage_peers(st)))
        lone, *others = first.stage_peers(stage)
        peers = {p: r for p, r in records.items() if p not in others}
        assert published(s.observe(fresh(peers), now))
        now += LATER
    stage = s.schedule.placement[lone]
    draining = {**peers, lone: dataclasses.replace(peers[lone], state=PeerState.DRAINING)}
    actions = s.observe(fresh(draining), now)
    (new,) = published(actions)
    assert lone not in new.placement and new.meta["start_iteration"] == 4  # the iteration in progress goes on
    assert not any(isinstance(m, Gone) for m in notices(actions))  # nobody detours around a peer still serving
    (mover, source), = new.meta["handover"].items()
    assert source == lone and new.placement[mover] == stage
    before = s.epochs.all[-2].placement
    assert len([p for p in before if before[p] == before[mover]]) >= 2  # its old stage keeps a peer
    assert all(new.placement[p] == st for p, st in before.items() if p not in (lone, mover))  # nobody else moves
    validate(new, balance_tolerance=None)
    assert s.observe(fresh(draining), now + 1.0) == []  # the same view again: no further epoch


@pytest.mark.parametrize("ends_run_on_stop", [True, False])
def test_a_stopped_coordinator_tells_the_peers_the_run_is_over_but_a_leaving_scheduler_role_does_not(
        ends_run_on_stop):
    s = make_scheduler("skippipe", ends_run_on_stop=ends_run_on_stop)
    assert s.closing(stopped=False) is None
    assert s.closing(stopped=True) == (Finished(iterations=0, epoch=0, stopped=True) if ends_run_on_stop else None)


def test_a_run_that_reached_its_last_iteration_is_finished(records):
    config = dataclasses.replace(make_scheduler().config, iterations=2)
    s = Scheduler(config, make_replanner().model, "coordinator", ends_run_on_stop=False)
    planned(s, records)
    commit(s, 2)
    assert s.done and s.closing(stopped=False) == Finished(iterations=2, epoch=0)


def test_a_broken_microbatch_convicts_a_peer_on_corroborated_reports_and_a_rerun_leaves_it_out(records):
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 3)
    relay, reporter, second = [p for p, st in first.placement.items() if st != 0][:3]
    now = 3.0  # every heartbeat still looks fresh
    s.handle(reporter, Unreachable(peer=relay), now)
    actions = s.handle(reporter, Broken(peer=reporter, iteration=3, epoch=0, microbatch=2, attempt=0, gone=relay),
                       now)
    assert relay in s.liveness.live(now) and not published(actions)  # one peer's word convicts nobody
    s.handle(second, Broken(peer=second, iteration=3, epoch=0, microbatch=5, attempt=0, gone=relay), now)
    assert relay not in s.liveness.live(now)  # a second reporter: taken for gone
    # a holder that could not re-queue one asks for the iteration again: believed (a peer of its epoch is gone)
    (rerun,) = published(s.handle(reporter, Unrecoverable(peer=reporter, iteration=3, epoch=0, microbatch=2), now))
    assert rerun.meta["start_iteration"] == 3 and relay not in rerun.placement


def test_two_witnesses_of_one_iteration_convict_a_peer_however_far_apart_their_reports(records):
    """A relay that breaks one holder's microbatches in one epoch and another's in the rerun: each report alone has
    expired before the next comes, but both are about the same iteration."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    read = lambda: {p: (r, 1.0) for p, r in records.items()}  # noqa: E731  every heartbeat fresh
    relay, reporter, second = [p for p, st in first.placement.items() if st != 0][:3]
    s.handle(reporter, Broken(peer=reporter, iteration=0, epoch=0, microbatch=2, attempt=0, gone=relay), 3.0)
    s.handle(reporter, Broken(peer=reporter, iteration=0, epoch=0, microbatch=4, attempt=0, gone=relay), 3.5)
    assert relay in s.liveness.update(read(), 60.0)  # one witness, however often it speaks
    s.handle(second, Broken(peer=second, iteration=0, epoch=0, microbatch=5, attempt=0, gone=relay), 63.0)
    assert relay not in s.liveness.update(read(), 63.0)  # a second witness of the same iteration, 60 s later

    t = make_scheduler("skippipe")  # witnesses of different iterations do not add up
    first = planned(t, records)
    relay, reporter, second = [p for p, st in first.placement.items() if st != 0][:3]
    t.handle(reporter, Broken(peer=reporter, iteration=0, epoch=0, microbatch=2, attempt=0, gone=relay), 3.0)
    commit(t, 1, 30.0)
    assert relay in t.liveness.update(read(), 62.0)
    t.handle(second, Broken(peer=second, iteration=1, epoch=0, microbatch=5, attempt=0, gone=relay), 63.0)
    assert relay in t.liveness.update(read(), 63.0)


def test_a_joiner_is_placed_once_probed_and_restores_a_lost_data_holder_from_the_next_iteration(records):
    s = make_scheduler("skippipe", rebalance=False)  # survivors stay put: the lost holder's shard is carried
    first = planned(s, records)
    commit(s, 3)
    assert first.meta["shards"] == {h: [i] for i, h in enumerate(first.data_holders)}
    holder = first.data_holders[1]
    live = {p: r for p, r in records.items() if p != holder}
    (carrying,) = published(read_after_expiry(s, live, LATER))
    carried = carrying.meta["shards"]
    assert holder not in carried and sorted(k for ks in carried.values() for k in ks) == [0, 1, 2]
    carrier = next(h for h, ks in carried.items() if len(ks) == 2)
    assert len(carrying.routes_from(carrier)) == 8  # it injects its own microbatches and the lost shard's

    # a volunteer announces itself: not placed before its record shows its first round of link probes
    commit(s, 2)
    newcomer = dataclasses.replace(records[holder], peer_id="peer-new", state=PeerState.JOINING, links={})
    live = {**live, "peer-new": newcomer}
    assert s.observe(fresh(live), 2 * LATER) == []  # first seen
    assert s.observe(fresh(live), 2 * LATER + 10.0) == []  # settled, not yet past the probe wait
    live["peer-new"] = dataclasses.replace(newcomer, links=records[holder].links)
    (schedule,) = published(s.observe(fresh(live), 2 * LATER + 11.0))
    # it becomes a data holder and takes the carried shard over from the next iteration: the iteration in progress
    # goes on, and the schedule says its positions are as of the commit before it, so the joiner waits for that
    # iteration's commit and starts the shard where it leaves it (`ScheduleFollower.positions_for`)
    assert schedule.placement["peer-new"] == 0 and schedule.meta["start_iteration"] == 6
    assert schedule.meta["positions_after"] == 4 and s.completed == 5
    assert len(schedule.meta["shards"]["peer-new"]) == 1 and len(schedule.meta["shards"][carrier]) == 1
    assert {h: len(schedule.routes_from(h)) for h in schedule.data_holders} == dict.fromkeys(schedule.data_holders, 4)
    validate(schedule, balance_tolerance=None)


def joined(s: Scheduler, live: dict[str, PeerRecord], now: float) -> Schedule:
    """The epoch that places the joiner in `live`: seen at `now`, settled a moment later."""
    assert s.observe(fresh(live), now) == []
    (schedule,) = published(s.observe(fresh(live), now + SETTLE_SECONDS))
    return schedule


def test_a_joiner_with_its_own_documents_is_not_handed_a_carried_shard(records):
    s = make_scheduler("skippipe", rebalance=False)  # survivors stay put: the lost holder's shard is carried
    first = planned(s, records)
    commit(s, 2)
    gone = first.data_holders[0]
    live = {p: r for p, r in records.items() if p != gone}
    (carrying,) = published(read_after_expiry(s, live, LATER))
    carrier = next(h for h, ks in carrying.meta["shards"].items() if len(ks) == 2)
    # a volunteer with its own documents (--data) joins: a data holder, but it draws from them only
    commit(s, 2)
    own = dataclasses.replace(records[gone], peer_id="peer-own", state=PeerState.JOINING, data_holder=True)
    live = {**live, "peer-own": own}
    schedule = joined(s, live, 2 * LATER)
    assert schedule.placement["peer-own"] == 0 and schedule.meta["shards"].get("peer-own", []) == []
    assert len(schedule.meta["shards"][carrier]) == 2 and schedule.meta["start_iteration"] == 5
    # a plain volunteer joins next: it becomes the carried shard's holder
    commit(s, 2)
    plain = dataclasses.replace(records[gone], peer_id="peer-plain", state=PeerState.JOINING)
    live = {**live, "peer-plain": plain}
    schedule = joined(s, live, 3 * LATER)
    assert schedule.placement["peer-plain"] == 0 and len(schedule.meta["shards"]["peer-plain"]) == 1
    assert len(schedule.meta["shards"][carrier]) == 1 and schedule.meta["start_iteration"] == 7


def test_a_lost_data_holder_is_refilled_by_a_survivor_that_takes_the_carried_shard_over(records):
    """Without the move one holder carries two shards (twice the injections and loss steps) until a volunteer
    joins; the move buys most of that back at once, and the mover gets stage 0's state from a holder."""
    plans = {}
    for rebalance in (False, True):
        s = make_scheduler("skippipe", rebalance=rebalance)
        first = planned(s, records)
        commit(s, 3)
        gone = first.data_holders[1]
        (plans[rebalance],) = published(read_after_expiry(s, {p: r for p, r in records.items() if p != gone}, LATER))
    carried, moved = plans[False], plans[True]
    assert not carried.meta["handover"] and any(len(ks) == 2 for ks in carried.meta["shards"].values())
    (mover, source), = moved.meta["handover"].items()
    assert moved.placement[mover] == 0 and first.placement[mover] != 0 and first.placement[source] == 0
    assert len(first.stage_peers(first.placement[mover])) >= 2  # its old group keeps a peer
    assert all(moved.placement[p] == st for p, st in first.placement.items() if p not in (gone, mover))
    assert sorted(k for ks in moved.meta["shards"].values() for k in ks) == [0, 1, 2]
    assert {h: len(moved.routes_from(h)) for h in moved.data_holders} == dict.fromkeys(moved.data_holders, 4)
    # the mover draws the shard from the next iteration on, where the commit of this one leaves it (unmoved)
    assert moved.meta["start_iteration"] == 4
    assert moved.predicted_iteration_seconds < 0.9 * carried.predicted_iteration_seconds
    validate(moved, balance_tolerance=None)


@pytest.mark.parametrize("planner", ["skippipe", "full-pipeline"])
def test_a_stage_that_lost_every_peer_is_skipped_by_skippipe_and_refilled_for_the_full_pipeline(planner, records):
    s = make_scheduler(planner, rebalance=False)
    first = planned(s, records)
    commit(s, 3)
    stage = 2
    gone = first.stage_peers(stage)
    live = {p: r for p, r in records.items() if p not in gone}
    (new,) = published(read_after_expiry(s, live, LATER))
    if planner == "skippipe":  # paths route around the empty stage until a volunteer takes it over
        assert new.rules.unserved == {stage} and stage not in new.placement.values()
        assert not new.meta["restore"] and all(new.placement[p] == st for p, st in first.placement.items()
                                               if p in live)
        return
    # a full pipeline cannot skip it: a survivor moves there and restarts it from a neighbouring stage's peer
    (mover,) = [p for p in live if new.placement[p] != first.placement[p]]
    assert new.placement[mover] == stage and not new.rules.unserved
    assert abs(new.placement[new.meta["restore"][mover]] - stage) == 1 and not new.meta["handover"]
    assert {len(r.stages) for r in new.routes} == {STAGES - 1}


def test_a_joiner_whose_epoch_has_not_started_is_neither_moved_nor_a_source_of_state(records):
    """A holder dies while a joiner's first epoch waits for the next iteration, and the iteration in progress
    cannot finish: its rerun must not move the joiner (it does not hold its stage yet, and waits for that stage's
    state)."""
    s = make_scheduler("skippipe")
    newcomer = "peer-11"
    first_peers = {p: r for p, r in records.items() if p != newcomer}
    first = planned(s, first_peers)
    commit(s, 3)
    live = {**first_peers, newcomer: dataclasses.replace(records[newcomer], state=PeerState.JOINING)}
    epoch = joined(s, live, 5.0)
    assert epoch.meta["start_iteration"] == 4 and newcomer in epoch.meta["joiners"]
    holder, other = epoch.data_holders[:2]
    live = {p: r for p, r in live.items() if p != holder}
    (after,) = published(read_after_expiry(s, live, LATER))
    assert after.meta["start_iteration"] == 4 and after.placement[newcomer] == epoch.placement[newcomer]
    (rerun,) = published(s.handle(other, Unrecoverable(peer=other, iteration=3, epoch=0, microbatch=1), LATER))
    assert rerun.meta["start_iteration"] == 3 and rerun.placement[newcomer] == epoch.placement[newcomer]
    assert newcomer not in rerun.meta["handover"] and newcomer not in rerun.meta["handover"].values()
    # a mover's state comes from a peer that held the stage when the iteration in progress began
    assert all(first.placement.get(src) == rerun.placement[p] for p, src in rerun.meta["handover"].items())


def test_a_saved_plan_starts_the_run_once_its_peers_are_live_and_a_fresh_plan_otherwise(records):
    earlier = make_replanner("full-pipeline").plan(records, epoch=3, start_iteration=40)
    saved = Schedule.from_json(earlier.to_json())  # as `--first-schedule` reads it
    started = planned(make_scheduler("full-pipeline", first_schedule=saved), records)
    assert started.placement == earlier.placement and started.routes == earlier.routes
    assert started.epoch == 0 and started.meta["start_iteration"] == 0 and started.meta["saved_plan"]
    # the run's shards, one per holder, held by the holders its columns start at (the others inject nothing)
    shards = started.meta["shards"]
    assert set(shards) == set(earlier.data_holders) and started.meta["shard_positions"] == {}
    assert sorted(k for ks in shards.values() for k in ks) == list(range(len(earlier.data_holders)))
    assert {h for h, ks in shards.items() if ks} == {r.origin for r in started.routes}
    # one of its peers not here yet: wait for it, then plan afresh for those who are
    late = sorted(records)[5]
    fewer = {p: r for p, r in records.items() if p != late}
    s = make_scheduler("full-pipeline", first_schedule=saved)
    assert s.observe(fresh(fewer), 0.0) == [] and s.observe(fresh(fewer), 3.0) == []
    (fresh_plan,) = published(s.observe(fresh(fewer), LINK_WAIT_SECONDS))
    assert late not in fresh_plan.placement and "saved_plan" not in fresh_plan.meta
    # a peer pinning another stage than the plan gives it: no waiting, a fresh plan that keeps its pin
    pinned = sorted(records)[7]
    other = (earlier.placement[pinned] + 1) % STAGES
    moved = {**records, pinned: dataclasses.replace(records[pinned], stage=other)}
    fresh_plan = planned(make_scheduler("full-pipeline", first_schedule=saved), moved)
    assert fresh_plan.placement[pinned] == other and "saved_plan" not in fresh_plan.meta


def test_a_successor_reruns_the_iteration_in_progress_under_an_epoch_of_its_own(records):
    first = make_replanner().plan(records, epoch=0, start_iteration=0)
    s = make_scheduler(ends_run_on_stop=False)
    gone = next(p for p, st in first.placement.items() if st == 1)
    (resumed,) = published(s.resume([first], 7, fresh({p: r for p, r in records.items() if p != gone}), 0.0))
    assert resumed.epoch == 1 and resumed.meta["start_iteration"] == 7 and gone not in resumed.placement
    assert s.completed == 7 and s.schedule is resumed
    assert resumed.meta["shard_positions"] == first.meta.get("shard_positions", {})


def test_a_successor_starts_the_shards_where_the_dead_schedulers_last_commit_left_them(records):
    """The newest epoch's positions are those of its start; the commits since moved them on."""
    first = make_replanner().plan(records, epoch=0, start_iteration=0)
    s = make_scheduler(ends_run_on_stop=False)
    positions = {"0": {"holder": 0, "num_holders": 3, "epoch": 0, "cursor": 56}}
    (resumed,) = published(s.resume([first], 7, fresh(records), 0.0, shard_positions=positions))
    assert resumed.meta["shard_positions"] == positions and s.commits.shard_positions == positions


def test_a_change_that_cannot_be_planned_is_not_retried_every_tick(records, caplog):
    """Every data holder gone: no plan is possible until one joins; the scheduler says so once per retry period,
    not on every read of the records (a successor that saw every peer gone re-planned every 10 ms)."""

    s = make_scheduler()
    schedule = planned(s, records)
    rest = {p: r for p, r in records.items() if p not in schedule.data_holders}
    # a read that misses a quarter of the placed peers at once is suspect: they are pinged first (unanswered here)
    asked = {a.message.peer for a in s.observe(fresh(rest), LATER) if isinstance(a, Announce)}
    assert asked == set(schedule.data_holders)
    later = LATER + s.suspicions.pings.timeout
    s.check_pings(later)
    with caplog.at_level("ERROR"):
        for tick in range(50):
            s.observe(fresh(rest), later + tick * 0.01)
        assert len([r for r in caplog.records if "could not re-plan" in r.message]) == 1
        s.observe(fresh(rest), later + REPLAN_RETRY_SECONDS + 1)
        assert len([r for r in caplog.records if "could not re-plan" in r.message]) == 2


def test_the_last_data_holder_declared_gone_while_it_still_beats_is_taken_back_and_placed_again(records, caplog):
    """A loaded host stalls a holder's streams and its heartbeat store alike: one report and a late heartbeat
    convict it. With no other holder left no epoch without it can be planned, so nothing would ever tell it it was
    dropped: it would beat on, unplaced, and the run would wait for a holder for ever. It is taken back once its
    cool-down has passed, and only while it beats: a holder frozen since is not."""
    s = make_scheduler("skippipe", rebalance=False)  # no survivor moves to stage 0
    first = planned(s, records)
    commit(s, 2)
    *others, last = first.data_holders
    live = {p: r for p, r in records.items() if p not in others}
    (survivors,) = published(read_after_expiry(s, live, LATER))
    assert list(survivors.data_holders) == [last] and survivors.meta["start_iteration"] == 3  # `last` finishes 2
    reporter = next(p for p, st in survivors.placement.items() if st == 1)
    s.handle(reporter, Unreachable(peer=last), LATER + 1)
    late = {p: (r, 5.5 if p == last else 0.5) for p, r in live.items()}  # past 2.5 heartbeats of 2 s
    with caplog.at_level("ERROR"):
        actions = s.observe(late, LATER + 1)
    assert last in s.liveness.declared_gone and published(actions) == []
    assert Gone(peers=(last,), iteration=2, epoch=survivors.epoch) in notices(actions)
    assert any("every data holder" in r.message for r in caplog.records)

    beating = {p: (r, 0.5) for p, r in live.items()}
    back = LATER + 1 + FIRST_REJOIN_COOLDOWN
    assert published(s.observe(beating, back - 1)) == []  # its cool-down first
    (again,) = published(s.observe(beating, back + REPLAN_RETRY_SECONDS))
    assert again.placement[last] == 0 and again.meta["start_iteration"] == 2 and last not in s.liveness.declared_gone
    commit(s, 1, back + REPLAN_RETRY_SECONDS)
    assert s.completed == 3  # the run goes on

    s.handle(reporter, Unreachable(peer=last), 100.0)  # declared again, and frozen since: never taken back
    for t in range(0, 12, 2):
        frozen = {p: (r, 5.5 + t if p == last else 0.5) for p, r in live.items()}
        assert published(s.observe(frozen, 100.0 + t)) == []
    assert last in s.liveness.declared_gone


def test_two_members_of_a_stage_that_cannot_reach_each_other_are_split_and_one_comes_back_later(records):
    """Each reports the other unreachable while both heartbeat: they cannot average, so one sits out (the later to
    join; of two seen first at once, the larger id), the run re-plans without it, and it is placed again once its
    cool-down is over."""
    s = make_scheduler("skippipe")
    ages = dict.fromkeys(records, 1.0)
    read = lambda: {p: (r, ages[p]) for p, r in records.items()}  # noqa: E731
    first = planned(s, records)
    stage = next(st for st in range(1, STAGES) if sum(v == st for v in first.placement.values()) >= 2)
    mate, late = sorted(p for p, st in first.placement.items() if st == stage)[:2]
    other = next(p for p, st in first.placement.items() if st not in (0, stage))
    far = next(p for p, st in first.placement.items() if st not in (0, stage, first.placement[other]))
    now = 10.0
    assert published(s.observe(read(), now)) == []  # every heartbeat fresh
    s.handle(far, Unreachable(peer=other), now)  # across stages: no averaging between them, nothing to split
    s.handle(other, Unreachable(peer=far), now)
    s.handle(late, Unreachable(peer=mate), now)  # one way only: one broken link, or a liar; nobody sits out
    assert s.suspicions.estrangements.sitting_out(now) == set()
    assert published(s.observe(read(), now)) == []
    told = notices(s.handle(mate, Unreachable(peer=late), now))  # both ways, both alive: they cannot average
    assert told == [SitOut(peer=late, partner=mate, stage=stage, seconds=60.0)]  # the one sitting out is told
    assert s.suspicions.estrangements.sitting_out(now) == {late}
    (split,) = published(s.observe(read(), now + 0.5))
    assert late not in split.placement and {mate, other, far} <= set(split.placement)
    assert split.meta["start_iteration"] == s.completed + 1  # not a holder: the iteration in progress goes on
    assert late not in s.liveness.declared_gone  # not taken for dead, and never evicted
    records[late] = dataclasses.replace(records[late], state=PeerState.JOINING)  # it asks to be placed again
    assert published(s.observe(read(), now + 30.0)) == []  # still sitting out
    (back,) = published(s.observe(read(), now + 61.0))
    assert late in back.placement


def test_a_member_that_cannot_be_dialled_and_is_reported_by_its_mate_sits_out(records):
    """One way round: its mate cannot send it gradients, it can send its own. Its record says it takes no
    connection (the coordinator's dial-back verdict, no relay): it sits out, whoever joined first. A report against
    a mate whose record says nothing of the kind benches nobody."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    stage = next(st for st in range(1, STAGES) if sum(v == st for v in first.placement.values()) >= 2)
    home, mate = sorted(p for p, st in first.placement.items() if st == stage)[:2]  # the later rule benches `mate`
    now = 10.0
    s.observe(fresh(records), now)
    assert notices(s.handle(mate, Unreachable(peer=home), now)) == []
    records[home] = dataclasses.replace(records[home], reachability="unreachable")
    s.observe(fresh(records), now + 1)
    told = notices(s.handle(mate, Unreachable(peer=home), now + 1))
    assert told == [SitOut(peer=home, partner=mate, stage=stage, seconds=60.0)]
    (split,) = published(s.observe(fresh(records), now + 1.5))
    assert home not in split.placement and mate in split.placement
