"""`PlanDesk`: the scheduler's re-plans from asked for to published, one at a time; no I/O.

A re-plan is a `PlanJob`: made on the spot, or, with `background`, by the owner off its loop (the scheduler asks
for it with `MakePlan` and is handed it back), while iterations go on committing under the epoch in force. What a
job comes back with is settled here: taken as it is, or from the next iteration if iterations committed meanwhile
(`rebase_start`), or asked for again where it cannot start there, or given up. An epoch published goes on being
awaited (`storing`) until its owner reports its DHT store. The next plan is made meanwhile (a death or a joiner
seen during a store does not wait for it: plan and store took 3-6 s each on a loaded 20-peer host), but is published
only once that store is over (`parked`): two stores under way could land out of order. The peers take an epoch from
the notice that carries it on gossip, and read it from the DHT only where it was too large to carry: then the
iteration before its start may not commit before they can (`holding`, `holds`), and an epoch whose store would
outlast the iteration in progress starts an iteration later (`later_start`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping

from scheduler.schedule import Schedule
from swarm.constants import MAX_GOSSIPED_SCHEDULE_BYTES
from swarm.control.messages import ScheduleNotice, Stuck, Unrecoverable
from swarm.coordinator.cost_drift import CostDrift
from swarm.coordinator.epochs import EpochHistory
from swarm.coordinator.liveness import Liveness
from swarm.coordinator.plan_job import PlanJob, rebase_start, rebased
from swarm.coordinator.replanner import NoDataHolder, Replanner
from swarm.coordinator.slow_peers import SlowPeers
from swarm.events import event
from swarm.wire import PeerRecord, ScheduleMsg

logger = logging.getLogger(__name__)

REPLAN_RETRY_SECONDS = 5.0
"""A membership change that could not be planned (no data holder left) is tried again after this long, or at once
when the membership changes again."""
STORE_SECONDS = 2.0
"""What an epoch's DHT store is taken to last until stores were timed (`store_seconds`)."""
STORES_KEPT = 5
"""The stores whose durations `store_seconds` is the median of."""


class PlanDesk:
    """The re-plan under way (`planning`), the epoch being stored (`storing`), and the membership change that could not
    be planned. `now` arguments are monotonic seconds.

    :param liveness: the scheduler's (holders declared gone that still beat are taken back when no holder is left)
    :param slow: the scheduler's slow peers (their measured speeds and shares go into each plan)
    :param drift: the scheduler's cost drift (a plan asked for by it is published where it pays)
    :param background: plans are made off the owner's loop (see the module docstring)
    :param carry_limit: the largest epoch (msgpack bytes) a notice carries; a larger one is read from the DHT
    """

    def __init__(self, liveness: Liveness, slow: SlowPeers, drift: CostDrift, *, background: bool = False,
                 carry_limit: int = MAX_GOSSIPED_SCHEDULE_BYTES) -> None:
        self.liveness, self.slow, self.drift, self.background = liveness, slow, drift, background
        self.carry_limit = carry_limit
        self.planning: PlanJob | None = None
        """The re-plan being made off the loop, if any (one at a time: a change seen meanwhile is planned after it)."""
        self.storing: Schedule | None = None
        """The epoch being stored in the DHT, if any: the next plan's publication waits for it (and commits, where
        `holding`)."""
        self.parked: PlanJob | None = None
        """A plan made while the epoch before it was being stored, settled once that store is over."""
        self._failed: tuple[tuple, float] | None = None
        """(The membership change that could not be planned, when it was tried)."""
        self._deferred: list[tuple[str, Stuck | Unrecoverable]] = []
        self.holding = False
        """Whether the epoch being stored holds the commit of the iteration before its start (the peers read it from
        the DHT: it was too large to gossip)."""
        self._store_started = 0.0
        self._stores: list[float] = []
        """How long the last `STORES_KEPT` stores took."""

    @property
    def busy(self) -> bool:
        """Whether a re-plan is being made, or made and waiting for a store: no other is asked for."""
        return self.planning is not None or self.parked is not None

    def park(self, job: PlanJob) -> bool:
        """Keep `job`, made, if an epoch is being stored: it is settled once that store is over (`take_parked`).
        Whether it was kept (else it is settled now)."""
        if self.storing is None:
            return False
        if job is self.planning:
            self.planning = None
        self.parked = job
        return True

    def take_parked(self) -> PlanJob | None:
        """The plan `park` kept, once no store is under way (else None); it is kept no more."""
        if self.storing is not None:
            return None
        parked, self.parked = self.parked, None
        return parked

    def defer(self, sender: str, report: Stuck | Unrecoverable, *, keep: int) -> None:
        """Keep `sender`'s report of an iteration unable to finish, which came while a re-plan was under way, to be
        judged after it (the newest `keep` of them)."""
        self._deferred = [*self._deferred[-keep + 1:], (sender, report)] if keep > 1 else [(sender, report)]

    def take_deferred(self) -> list[tuple[str, Stuck | Unrecoverable]]:
        """The reports `defer` kept, oldest first; they are kept no more."""
        deferred, self._deferred = self._deferred, []
        return deferred

    def ask(self, job: PlanJob, replanner: Replanner) -> bool:
        """Have `job` made: True if it is to be made off the loop (the owner hands it to `Scheduler.planned`), False
        if it was made here and now."""
        if self.background:
            self.planning = job
        else:
            job.run(replanner)
        return self.background

    def failed_lately(self, change: tuple, now: float) -> bool:
        """Whether membership change `change` could not be planned a moment ago (no data holder left): it is tried
        again after `REPLAN_RETRY_SECONDS`, not every look."""
        return self._failed is not None and self._failed[0] == change and now - self._failed[1] < REPLAN_RETRY_SECONDS

    def job(self, peers: Mapping[str, PeerRecord], *, why: str, start: int, completed: int, epochs: EpochHistory,
            shard_positions: Mapping[str, Mapping[str, int]], handing_over: Iterable[str] = (),
            change: tuple | None = None, drift: Mapping | None = None) -> PlanJob:
        """A re-plan of `peers` from iteration `start` (`completed` iterations committed), on a snapshot of what
        the scheduler knows now: their measured speeds applied, the epochs, the shards' positions, the holders'
        shares, who holds no state (see `PlanJob` for the rest)."""
        return PlanJob(why=why, peers=dict(peers), records=self.slow.speeds.applied(peers), start=start,
                       asked_at=completed, history=EpochHistory(epochs.all),
                       shard_positions={k: dict(v) for k, v in shard_positions.items()},
                       handing_over=tuple(handing_over), stateless=frozenset(self.liveness.stateless),
                       shares=self.slow.holders.shares.slowed, change=change, drift=drift)

    @property
    def store_seconds(self) -> float:
        """What an epoch's store is expected to take: the median of the last few."""
        return sorted(self._stores)[len(self._stores) // 2] if self._stores else STORE_SECONDS

    def settle(self, job: PlanJob, *, completed: int, epochs: EpochHistory,
               shard_positions: Mapping[str, Mapping[str, int]], evicted: Collection[str],
               now: float, commit_in: float | None = None) -> Schedule | PlanJob | None:
        """What becomes of `job`, made, `completed` iterations being committed now: its epoch to publish (from the
        next iteration if iterations committed meanwhile), a job to make instead (holders taken back, or the epoch
        it follows changed), or None (it could not be made, or it does not pay: logged). `commit_in`: seconds until
        the iteration in progress is due to commit; an epoch whose store would outlast them starts an iteration
        later (`later_start`)."""
        if job is self.planning:
            self.planning = None
        again = {"why": job.why, "completed": completed, "epochs": epochs, "shard_positions": shard_positions,
                 "start": job.start if completed == job.asked_at else completed + 1,
                 "handing_over": job.handing_over, "change": job.change, "drift": job.drift}
        outcome = job.outcome
        if isinstance(outcome, NoDataHolder):
            # holders declared gone that still beat are taken back: without one no epoch can tell them they
            # were dropped, and the run would stand still (`Liveness.take_back` says why and when)
            latest = epochs.latest
            back = self.liveness.take_back([p for p, st in latest.placement.items() if st == 0 and p not in evicted],
                                           now, why="every data holder is gone and it still beats")
            if back:
                return self.job({**job.peers, **back}, **again)
            outcome = NoDataHolder(f"{outcome}; the newest epoch's: " + "; ".join(
                f"{p}: {self.liveness.describe(p, now)}" for p in latest.data_holders))
        if not isinstance(outcome, Schedule):
            logger.error("could not re-plan: %s", outcome)
            if job.change is not None:
                self._failed = (job.change, now)
            return None
        if job.change is not None:
            self._failed = None
        logger.info("plan %d (%s, epoch %d) made in %.2f s", job.number, job.why, outcome.epoch, job.seconds)
        start = rebase_start(job, completed, epochs)
        if start is None:
            logger.info("plan %d (%s) was made after epoch %d from iteration %d; the iteration in progress is now %d "
                        "under epoch %d: it is made again", job.number, job.why, job.after, job.start, completed,
                        epochs.in_force(completed).epoch)
            return self.job(job.peers, **again)
        if start != job.start:
            logger.info("plan %d (%s): %d iteration(s) committed while it was made: it starts at iteration %d, not %d",
                        job.number, job.why, completed - job.asked_at, start, job.start,
                        extra=event("plan_rebased", epoch=outcome.epoch, start_iteration=start, asked=job.start,
                                    why="committed"))
        later = self.later_start(job, start, completed, epochs, commit_in)
        if later != start:
            logger.info("plan %d (%s): its store (~%.1f s) would hold the commit of iteration %d, due in %.1f s: it "
                        "starts at iteration %d", job.number, job.why, self.store_seconds, completed, commit_in, later,
                        extra=event("plan_rebased", epoch=outcome.epoch, start_iteration=later, asked=job.start,
                                    why="store"))
            start = later
        if start != job.start:
            rebased(outcome, start, shard_positions)
        if job.drift and not self.drift.pays(job.drift, job.gain, start):
            return None
        return outcome

    def later_start(self, job: PlanJob, start: int, completed: int, epochs: EpochHistory,
                    commit_in: float | None) -> int:
        """Where a plan made off the loop starts, `start` being the next iteration: one later when its epoch's store
        would outlast the iteration in progress (due to commit in `commit_in` s). That iteration's commit would wait
        for the store (the peers read an epoch from the DHT before they start it: a store took 3-7 s on a loaded
        20-peer host, holding every peer); one more iteration under the epoch in force costs a dead holder's share
        of it, or detours around a dead relay. Only while epochs are read from the DHT (the last one's store held
        the commits: an epoch of this swarm's size was too large to gossip); never a rerun's, and not where an epoch
        starts at the next iteration (the plan's joiners and hand-overs were reckoned against the one in force)."""
        if not self.background or not self.holding or job.rerun or start != completed + 1 or commit_in is None or \
                commit_in >= self.store_seconds or epochs.in_force(start).epoch != epochs.in_force(completed).epoch:
            return start
        return start + 1

    def publish(self, schedule: Schedule, bridge: Schedule | None, now: float) -> ScheduleNotice:
        """The notice of `schedule` (with `bridge`, see `ScheduleMsg.bridge`), carrying it where it fits
        `carry_limit`. Off the loop, its store is under way from `now`; where the notice does not carry it, the peers
        read it from the DHT, so the commits wait for the store (`holding`, `holds`)."""
        notice = ScheduleNotice.of(ScheduleMsg.from_schedule(schedule, bridge), self.carry_limit)
        if self.background:
            self.storing, self._store_started, self.holding = schedule, now, not notice.schedule
        return notice

    def stored(self, schedule: Schedule, ok: bool, epochs: EpochHistory, now: float) -> None:
        """`schedule`'s store is over: stored, or not (`ok`). An epoch the peers were to read from the DHT is then
        withdrawn from `epochs` (the epoch before it stays the newest, and the next look re-plans); one its notice
        carried stays (the peers have it, and another epoch under its number would contradict it)."""
        if not ok and not (schedule is self.storing and not self.holding):
            epochs.withdraw(schedule)
        if schedule is self.storing:
            self.storing = None
            self._stores = [*self._stores[-STORES_KEPT + 1:], max(0.0, now - self._store_started)]
            logger.info("epoch %d's store %s after %.1f s", schedule.epoch, "done" if ok else "failed",
                        self._stores[-1])

    def holds(self, completed: int) -> bool:
        """Whether the commit of iteration `completed` waits for the epoch being stored: the peers start the next
        iteration at that commit, and must read an epoch that starts there, or earlier, first."""
        return self.storing is not None and self.holding and \
            int(self.storing.meta.get("start_iteration", 0)) <= completed + 1
