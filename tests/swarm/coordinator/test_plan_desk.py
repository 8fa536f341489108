"""Re-plans made off the scheduler's loop (`Scheduler(background_plans=True)`, `PlanDesk`): iterations commit while a
plan is made, its epoch starts after them and travels in its notice, commits wait for the store only of an epoch too
large to carry, and what comes meanwhile (a second death, reports of a stuck iteration) is acted on after it. The
owner's part (running the job in a thread, storing the epoch) is played here by calling `PlanJob.run`,
`Scheduler.planned` and `Scheduler.stored` in turn."""

from __future__ import annotations

from scheduler.schedule import Schedule
from swarm.control.messages import Commit, Done, Gone, Ping, SitOut, Stuck, Unreachable
from swarm.coordinator.actions import Announce, MakePlan, PublishSchedule
from swarm.coordinator.first_plan import SETTLE_SECONDS
from swarm.coordinator.scheduler import Scheduler
from swarm.events import EVENT_ATTR
from swarm.wire import PeerRecord
from tests.swarm.coordinator.conftest import make_scheduler, read_after_expiry

LATER = 20.0
"""Past a record's lifetime (see `read_after_expiry`)."""


def fresh(peers: dict[str, PeerRecord]) -> dict:
    return {p: (r, 0.5) for p, r in peers.items()}


def first_epoch(s: Scheduler, records: dict[str, PeerRecord]) -> Schedule:
    """`s`'s epoch 0 of `records`, stored."""
    s.observe(fresh(records), 0.0)
    (action,) = [a for a in s.observe(fresh(records), SETTLE_SECONDS) if isinstance(a, PublishSchedule)]
    assert s.plans.storing is action.schedule  # no commit before the peers can read it
    s.stored(action.schedule, True, SETTLE_SECONDS + 1.0)  # a store of 1 s
    return action.schedule


def report(s: Scheduler, holders: list[str], now: float) -> list:
    """`holders` report the iteration in progress done under the epoch running it."""
    running, actions = s.epochs.in_force(s.completed), []
    for h in holders:
        actions += s.handle(h, Done(peer=h, iteration=s.completed, epoch=running.epoch, loss_sum=2.0, losses=4,
                                    tokens=256, started=100.0, finished=101.0), now)
    return actions


def commits(actions: list) -> list[Commit]:
    return [a.message for a in actions if isinstance(a, Announce) and isinstance(a.message, Commit)]


def notices(actions: list) -> list:
    return [a.message for a in actions if isinstance(a, Announce)]


def gone_notices(actions: list) -> list[Gone]:
    return [a.message for a in actions if isinstance(a, Announce) and isinstance(a.message, Gone)]


def jobs(actions: list) -> list:
    return [a.job for a in actions if isinstance(a, MakePlan)]


def make_plan(s: Scheduler, job, now: float) -> list:
    """The owner's thread makes `job`, and hands it back on the loop."""
    job.run(s.replanner)
    return s.planned(job, now)


def test_iterations_commit_while_a_plan_is_made_and_its_epoch_starts_after_them(records, caplog):
    s = make_scheduler(background_plans=True)
    first = first_epoch(s, records)
    report(s, first.data_holders, 3.0)
    assert s.completed == 1
    holder = first.data_holders[-1]
    actions = read_after_expiry(s, {p: r for p, r in records.items() if p != holder}, LATER)
    (job,) = jobs(actions)  # asked for, not made: nothing is published yet
    assert job.start == 2 and not [a for a in actions if isinstance(a, PublishSchedule)]
    assert gone_notices(actions) == [Gone(peers=(holder,), iteration=1, epoch=0)]
    # the other holders' reports commit iterations 1 and 2 under epoch 0, without the gone holder (30 s apart)
    others = [h for h in first.data_holders if h != holder]
    for iteration in (1, 2):
        (done,) = commits(report(s, others, LATER + 30 * iteration))
        assert done.iteration == iteration and done.epoch == 0 and holder in done.left_out
    assert s.plans.busy and s.completed == 3
    caplog.set_level("INFO")
    (publish,) = [a for a in make_plan(s, job, LATER + 61) if isinstance(a, PublishSchedule)]
    new = publish.schedule
    # it starts at the iteration after the one in progress, from the shards' positions of the last commit
    assert new.meta["start_iteration"] == 4 and holder not in new.placement
    assert new.meta["positions_after"] == 2 and new.meta["shard_positions"] == s.commits.shard_positions
    (rebased,) = [getattr(r, EVENT_ATTR) for r in caplog.records
                  if getattr(r, EVENT_ATTR, {}).get("event") == "plan_rebased"]
    assert rebased["start_iteration"] == 4 and rebased["asked"] == 2 and rebased["why"] == "committed"
    # the notice carries the epoch: iteration 3, under epoch 0, commits while it is being stored (the peers have it)
    carried = publish.notice.carried()
    assert carried is not None and carried.to_schedule().to_dict() == new.to_dict() and carried.bridge is None
    (done,) = commits(report(s, others, LATER + 62))
    assert done.iteration == 3 and done.epoch == 0 and s.completed == 4 and s.plans.storing is new
    # its store fails: it stays (the peers run it), and the next plan waited for the store only
    assert s.stored(new, False, LATER + 63) == [] and s.epochs.latest is new and not s.plans.busy
    (done,) = commits(report(s, new.data_holders, LATER + 64))
    assert done.epoch == new.epoch


def test_the_commits_wait_for_the_store_of_an_epoch_too_large_to_carry(records):
    """Where a notice cannot carry its epoch (`carry_limit`), the peers read it from the DHT before the iteration it
    starts at: the commit of the iteration before waits for its store."""
    s = make_scheduler(background_plans=True, carry_limit=0)
    first = first_epoch(s, records)
    holder = first.data_holders[-1]
    (job,) = jobs(read_after_expiry(s, {p: r for p, r in records.items() if p != holder}, LATER))
    others = [h for h in first.data_holders if h != holder]
    (publish,) = [a for a in make_plan(s, job, LATER + 1) if isinstance(a, PublishSchedule)]
    new = publish.schedule
    assert new.meta["start_iteration"] == 1 and publish.notice.carried() is None and publish.notice.epoch == new.epoch
    assert report(s, others, LATER + 2) == [] and s.completed == 0  # iteration 0 waits for epoch 1's store
    (done,) = commits(s.stored(new, True, LATER + 3))
    assert done.iteration == 0 and s.completed == 1 and not s.plans.busy


def test_an_epoch_whose_store_would_hold_a_commit_due_soon_starts_an_iteration_later(records, caplog):
    """Commits come every 10 s; a plan made 9.5 s after the last one would have its store (1 s, as the last) hold the
    commit due in 0.5 s, every peer waiting: it starts an iteration later, and only that iteration's commit waits for
    a store still under way."""
    s = make_scheduler(background_plans=True, carry_limit=0)  # the peers read every epoch from the DHT
    first = first_epoch(s, records)
    for t in (10.0, 20.0):
        report(s, first.data_holders, t)
    relay = next(p for p, st in first.placement.items() if st == 2)
    (job,) = jobs(read_after_expiry(s, {p: r for p, r in records.items() if p != relay}, 29.0))
    caplog.set_level("INFO")
    (publish,) = [a for a in make_plan(s, job, 29.5) if isinstance(a, PublishSchedule)]
    new = publish.schedule
    assert job.start == 3 and new.meta["start_iteration"] == 4 and s.plans.storing is new
    (rebased,) = [getattr(r, EVENT_ATTR) for r in caplog.records
                  if getattr(r, EVENT_ATTR, {}).get("event") == "plan_rebased"]
    assert rebased == {**rebased, "start_iteration": 4, "asked": 3, "why": "store"}
    (done,) = commits(report(s, first.data_holders, 30.0))  # not held: iteration 3 runs under epoch 0 still
    assert done.iteration == 2 and s.completed == 3
    assert report(s, first.data_holders, 40.0) == []  # iteration 3's commit starts epoch 1's: it waits for the store
    (done,) = commits(s.stored(new, True, 41.0))
    assert done.iteration == 3 and s.plans.store_seconds == 11.5


def test_a_death_while_a_plan_is_made_is_told_at_once_and_planned_after_it(records):
    s = make_scheduler(background_plans=True)
    first = first_epoch(s, records)
    relays = [p for p, st in first.placement.items() if st == 2]
    live = {p: r for p, r in records.items() if p != relays[0]}
    (job,) = jobs(read_after_expiry(s, live, LATER))
    # a second relay dies while the first re-plan is made: the peers hear of it, no second plan is asked for
    rest = {p: r for p, r in live.items() if p != relays[1]}
    actions = read_after_expiry(s, rest, 2 * LATER)
    assert gone_notices(actions) == [Gone(peers=(relays[1],), iteration=0, epoch=0)] and jobs(actions) == []
    assert [a for a in s.observe(fresh(rest), 2 * LATER + 1) if not isinstance(a, Announce)] == []
    assert gone_notices(s.observe(fresh(rest), 2 * LATER + 1)) == []  # told once under an epoch
    (publish,) = [a for a in make_plan(s, job, 2 * LATER + 2) if isinstance(a, PublishSchedule)]
    assert relays[1] in publish.schedule.placement  # planned before it died
    s.stored(publish.schedule, True, 2 * LATER + 3)
    actions = s.observe(fresh(rest), 2 * LATER + 4)
    (again,) = jobs(actions)
    assert gone_notices(actions) == [Gone(peers=(relays[1],), iteration=0, epoch=publish.schedule.epoch)]
    (publish,) = [a for a in make_plan(s, again, 2 * LATER + 5) if isinstance(a, PublishSchedule)]
    assert not set(relays[:2]) & set(publish.schedule.placement)


def test_reports_of_a_stuck_iteration_that_come_while_a_plan_is_made_are_judged_once_it_is_published(records):
    s = make_scheduler(background_plans=True)
    first = first_epoch(s, records)
    holder = first.data_holders[-1]
    (job,) = jobs(read_after_expiry(s, {p: r for p, r in records.items() if p != holder}, LATER))
    a, b = [p for p in first.placement if p != holder][:2]
    for p in (a, b):
        assert s.handle(p, Stuck(peer=p, iteration=0, epoch=0), LATER + 1) == []
    actions = make_plan(s, job, LATER + 2)
    (publish,) = [x for x in actions if isinstance(x, PublishSchedule)]
    assert publish.schedule.meta["start_iteration"] == 1
    # once the epoch is published, the two reports are believed: iteration 0 runs again (its store holds no plan up)
    (rerun,) = jobs(actions)
    assert rerun.why == "restart" and rerun.start == 0 and rerun.after == publish.schedule.epoch
    # made before that store is over, the rerun's epoch is published after it
    assert [x for x in make_plan(s, rerun, LATER + 3) if isinstance(x, PublishSchedule)] == []
    (again,) = [x for x in s.stored(publish.schedule, True, LATER + 4) if isinstance(x, PublishSchedule)]
    assert again.schedule.epoch == publish.schedule.epoch + 1 and again.schedule.meta["start_iteration"] == 0


def test_a_death_while_an_epoch_is_stored_is_planned_at_once_and_published_after_the_store(records):
    """Plan and store took 3-6 s each on a loaded 20-peer host: a death (or a joiner) seen during a store is planned
    meanwhile, and its epoch published once the store is over (two stores under way could land out of order)."""
    s = make_scheduler(background_plans=True)
    first = first_epoch(s, records)
    relays = [p for p, st in first.placement.items() if st == 2]
    live = {p: r for p, r in records.items() if p != relays[0]}
    (job,) = jobs(read_after_expiry(s, live, LATER))
    (publish,) = [a for a in make_plan(s, job, LATER + 1) if isinstance(a, PublishSchedule)]
    assert s.plans.storing is publish.schedule and not s.plans.busy
    rest = {p: r for p, r in live.items() if p != relays[1]}
    actions = read_after_expiry(s, rest, 2 * LATER)
    (again,) = jobs(actions)
    assert again.after == publish.schedule.epoch
    assert gone_notices(actions) == [Gone(peers=(relays[1],), iteration=0, epoch=publish.schedule.epoch)]
    assert [a for a in make_plan(s, again, 2 * LATER + 1) if isinstance(a, PublishSchedule)] == []
    assert s.plans.busy and jobs(s.observe(fresh(rest), 2 * LATER + 1.5)) == []  # one plan at a time
    (second,) = [a for a in s.stored(publish.schedule, True, 2 * LATER + 2) if isinstance(a, PublishSchedule)]
    assert second.schedule.epoch == publish.schedule.epoch + 1 and s.plans.storing is second.schedule
    assert not set(relays[:2]) & set(second.schedule.placement)


def test_a_plan_made_during_the_store_of_an_epoch_that_then_failed_is_made_again(records):
    """An epoch the peers read from the DHT, whose store failed, is withdrawn: the plan made after it meanwhile
    follows an epoch that is not there, and is made again after the one before."""
    s = make_scheduler(background_plans=True, carry_limit=0)
    first = first_epoch(s, records)
    relays = [p for p, st in first.placement.items() if st == 2]
    live = {p: r for p, r in records.items() if p != relays[0]}
    (job,) = jobs(read_after_expiry(s, live, LATER))
    (publish,) = [a for a in make_plan(s, job, LATER + 1) if isinstance(a, PublishSchedule)]
    rest = {p: r for p, r in live.items() if p != relays[1]}
    (again,) = jobs(read_after_expiry(s, rest, 2 * LATER))
    assert make_plan(s, again, 2 * LATER + 1) == []  # parked; nothing commits meanwhile
    (remade,) = jobs(s.stored(publish.schedule, False, 2 * LATER + 2))
    assert s.schedule.epoch == 0 and remade.after == 0


def test_an_epoch_the_peers_read_from_the_dht_whose_store_failed_is_withdrawn_and_planned_again(records):
    s = make_scheduler(background_plans=True, carry_limit=0)
    first_epoch(s, records)
    relay = next(p for p, st in s.schedule.placement.items() if st == 3)
    live = {p: r for p, r in records.items() if p != relay}
    (job,) = jobs(read_after_expiry(s, live, LATER))
    (publish,) = [x for x in make_plan(s, job, LATER + 1) if isinstance(x, PublishSchedule)]
    assert s.schedule is publish.schedule
    s.stored(publish.schedule, False, LATER + 2)
    assert s.schedule.epoch == 0 and not s.plans.busy
    (again,) = jobs(s.observe(fresh(live), LATER + 3))
    assert again.after == 0


def test_pings_and_commits_are_not_held_by_a_plan_under_way(records):
    """What a plan made on the spot held for its duration goes on: a record missed by the reads is pinged."""
    s = make_scheduler(background_plans=True)
    first = first_epoch(s, records)
    relay = next(p for p, st in first.placement.items() if st == 2)
    live = {p: r for p, r in records.items() if p != relay}
    jobs(read_after_expiry(s, live, LATER))
    quiet = next(p for p in live if p not in first.data_holders)
    unread = {p: r for p, r in live.items() if p != quiet}
    pings = [a.message for a in s.observe(fresh(unread), 2 * LATER) if isinstance(a, Announce)
             and isinstance(a.message, Ping)]
    assert [p.peer for p in pings] == [quiet]
    assert [c.iteration for c in commits(report(s, first.data_holders, 2 * LATER + 1))] == [0]
    assert s.plans.planning is not None


def test_a_peer_told_to_sit_out_while_its_plan_is_made_is_not_convicted_by_reports_about_it(records):
    """Two members of a stage cannot reach each other: one sits out, is told gone, and the run re-plans without it.
    While the plan is made the epoch in force still places it, and peers that try it report it unreachable: it is
    planned around already, and those reports must not take it for dead (it is alive, and comes back later)."""
    s = make_scheduler(background_plans=True)
    first = first_epoch(s, records)
    stage = next(st for st in range(1, 6) if sum(v == st for v in first.placement.values()) >= 2)
    mate, late = sorted(p for p, st in first.placement.items() if st == stage)[:2]
    s.observe(fresh(records), 10.0)
    s.handle(late, Unreachable(peer=mate), 10.0)
    assert [m for m in notices(s.handle(mate, Unreachable(peer=late), 10.0)) if isinstance(m, SitOut)]
    actions = s.observe(fresh(records), 10.5)
    (job,) = jobs(actions)
    assert gone_notices(actions) == [Gone(peers=(late,), iteration=0, epoch=0)]
    for reporter in [p for p in first.placement if p not in (mate, late)][:2]:
        s.handle(reporter, Unreachable(peer=late), 11.0)
    assert late not in s.liveness.declared_gone
