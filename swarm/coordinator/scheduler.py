"""`Scheduler`: what the scheduler decides, as a function of what it observes; no I/O.

It is fed each read of the peers' heartbeat records (`observe`) and each control message (`handle`), and answers
with actions for its owner to carry out: publish a schedule epoch, announce a control message, record an
iteration's metrics. It plans the first epoch once the swarm has settled, re-plans when a scheduled peer is gone,
leaves or a joiner has settled, reruns an iteration reported stuck or unrecoverable, re-plans without a peer
that peers' reports convicted (`Suspicions`: corroborated reports, pings, estrangements, evictions), and commits
an iteration once every data holder has reported it.

A re-planned epoch starts at the next iteration: the one in progress goes on, its forwards detoured around gone
peers (peers are told who is gone); a plan made off the owner's loop starts at the next one not begun once it is
made (`PlanDesk`). A gone data holder's microbatches cannot finish: the iteration commits without
them (its draws go back to its shard, which a surviving holder takes over at the last commit's position), rather
than running again for the sake of one holder's share; it runs again under the new epoch only when no holder of it
is left or a holder is leaving (it hands its stage over first). A holder late against the others is left out of
the commit the same way, without being taken for gone (`CommitTracker.late`, `check_late_holders`); one the commits
show slow for good is given fewer microbatches by a re-plan from the next iteration (`HolderShares`), and one still
late at its smallest share is taken off the run's work for a while, as a peer sitting out; so is a relay whose own
passes stay far slower than the other relays' (`SlowPeers`). Every plan takes the peers' measured speeds, and a peer
whose speed, or a hop whose link, drifts from what its epoch assumed has the paths re-planned, on the same placement,
where that pays (`CostDrift`).
A joiner that takes over a shard another holder carries starts it where the commit of the iteration in progress leaves
it: every schedule says which commit its shard positions are as of (`meta["positions_after"]`), and such a joiner waits
for the later one. With the SWARM-style planner a stable swarm is also re-planned every `SWARM_REPLAN_ITERATIONS`
iterations (rebalanced and rewired), from the next iteration.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from scheduler.schedule import Schedule
from swarm.constants import MAX_GOSSIPED_SCHEDULE_BYTES
from swarm.control.messages import (
    Broken,
    ControlMessage,
    Done,
    Faulty,
    Finished,
    Join,
    Leave,
    Pace,
    Pong,
    Stuck,
    Unreachable,
    Unrecoverable,
)
from swarm.coordinator.actions import Action, Announce, MakePlan, PublishSchedule, RecordIteration
from swarm.coordinator.commit_tracker import CommitTracker, injectors, iteration_metrics
from swarm.coordinator.cost_drift import CostDrift
from swarm.coordinator.epochs import EpochHistory, successors
from swarm.coordinator.first_plan import SETTLE_SECONDS, FirstPlan
from swarm.coordinator.gone_notices import GoneNotices
from swarm.coordinator.liveness import Liveness
from swarm.coordinator.plan_desk import PlanDesk
from swarm.coordinator.plan_job import PlanJob
from swarm.coordinator.replanner import Replanner
from swarm.coordinator.restart_reports import RestartReports
from swarm.coordinator.slow_holders import ShareChange, log_share_changes
from swarm.coordinator.slow_peers import SlowPeers
from swarm.coordinator.suspicions import Suspicions
from swarm.events import event
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord, PeerState

logger = logging.getLogger(__name__)

JOIN_PROBE_SECONDS = 60.0
"""A peer joining mid-run is placed once its record shows its first round of link probes (it is ready to work,
and the planner knows its links), or after this long without them."""
SWARM_REPLAN_ITERATIONS = 10
"""With the SWARM-style planner, a stable swarm is re-planned once its epoch has run this many iterations: SWARM's
periodic rebalancing, and a fresh draw of its stochastic wiring (peers follow one wiring per epoch)."""


class Scheduler:
    """The scheduler of one run. `now` arguments are monotonic seconds.

    Its decisions (membership changes, commits, reruns) all read and change the same epoch history and liveness;
    what is pure or has state of its own has its component (`FirstPlan`, `Liveness`, `Suspicions`, `Replanner`,
    `PlanDesk`, `CommitTracker`, `GoneNotices`, `EpochHistory`, `RestartReports`, the successors in `epochs.py`).
    What stays is where those decisions meet: split further, each half would reach into the other's state.

    :param config: the run's configuration
    :param model: the run spec's model dictionary
    :param coordinator: the coordinator's peer id (its own heartbeat record is not a member)
    :param first_schedule: a saved plan of these peers to start from (used once every peer it places is live)
    :param ends_run_on_stop: whether stopping this scheduler ends the run (the coordinator process); a peer
      holding the role that leaves does not end it
    :param background_plans: a re-plan is asked for with `MakePlan`, whose job the owner makes off its loop and hands
      back to `planned`, and each epoch's store is reported to `stored` (see `PlanDesk`); else made on the spot
    """

    def __init__(self, config: RunConfig, model: Mapping, coordinator: str, *, first_schedule: Schedule | None = None,
                 ends_run_on_stop: bool = True, background_plans: bool = False,
                 carry_limit: int = MAX_GOSSIPED_SCHEDULE_BYTES) -> None:
        self.config = config
        self.replanner = Replanner(config, model)
        self.epochs = EpochHistory()
        self.liveness = Liveness(config.heartbeat, exclude=coordinator)
        self.commits = CommitTracker()
        self.slow = SlowPeers(config.microbatches, config.bench_seconds, self.replanner.layers_per_stage,
                              measured_speeds=config.measured_speeds)
        """Slow holders' shares, slow relays' verdicts, benches, and every peer's measured speed."""
        self.drift = CostDrift(self.slow.speeds, self.replanner.tables, links=config.link_drift)
        self.completed = 0
        """Iterations committed; the one in progress is `completed`."""
        self.peers_online = 0
        self.first_plan = FirstPlan(config, self.replanner, first_schedule)
        self.ends_run_on_stop = ends_run_on_stop
        self._restart_reports = RestartReports()
        self.gone = GoneNotices()
        self.suspicions = Suspicions(self.liveness, config.heartbeat, self.gone)
        """Peers' reports against each other, judged into `liveness` (pings, estrangements, evictions)."""
        self.plans = PlanDesk(self.liveness, self.slow, self.drift, background=background_plans,
                              carry_limit=carry_limit)

    @property
    def schedule(self) -> Schedule | None:
        """The newest epoch published."""
        return self.epochs.latest

    @property
    def done(self) -> bool:
        return bool(self.config.iterations) and self.completed >= self.config.iterations

    # ---- membership ---------------------------------------------------------------------------------
    def observe(self, records: Mapping[str, tuple[PeerRecord, float]], now: float) -> list[Action]:
        """One read of the peers' records (peer -> (record, seconds since its heartbeat)): plan the first epoch
        once the swarm has settled, or re-plan on a membership change."""
        peers = self.liveness.update(records, now)
        if self.schedule is not None:
            unread = self.liveness.unread(self.schedule.placement, now)
            pings = [a for p in unread for a in self.suspicions.ping(p, now, unread=True)]
            peers = self.liveness.live(now)  # those just asked stay live while their ping is awaited
            self.peers_online = len(peers)
            return pings + self._follow_membership(peers, now)
        self.peers_online = len(peers)
        first = self.first_plan.plan(peers, now)
        if first is None:
            return []
        self._restart_reports.progress(now)  # the first iteration's clock starts
        return self._publish(first, now)

    def resume(self, schedules: Iterable[Schedule], completed: int, records: Mapping[str, tuple[PeerRecord, float]],
               now: float, *, shard_positions: Mapping[str, dict] | None = None) -> list[Action]:
        """Take the role over from a dead scheduler (its epochs `schedules`, `completed` iterations in, shards at
        `shard_positions` or the newest epoch's, its slow peers as the newest epoch says): the iteration in progress
        reruns, reported again by every holder."""
        self.epochs, self.completed = EpochHistory(schedules), completed
        self.commits = CommitTracker(self.schedule.meta.get("shard_positions") if shard_positions is None else
                                     shard_positions)
        self._restart_reports.progress(now)
        self.slow.restore(self.schedule.meta.get("slow"), now)
        peers = self.liveness.update(records, now)
        return self._replan({p: r for p, r in peers.items() if p in self.schedule.placement}, start=completed, now=now,
                            why="resume")

    def _follow_membership(self, peers: dict[str, PeerRecord], now: float) -> list[Action]:
        """Re-plan when a scheduled peer is gone or leaving, or a new one has settled (see the module docstring
        for where the new epoch starts)."""
        placement = self.schedule.placement
        sitting_out = self._kept_out(now)
        for p in placement:
            if p not in peers:
                self.suspicions.estrangements.forget(p)  # gone: whoever sat out because of it may come back
                self.slow.forget([p])
        peers = {p: r for p, r in peers.items() if p not in sitting_out}
        handing = self.slow.handing_over(placement)  # benched last peers of their stages, planned as if leaving
        gone = [p for p in placement if p not in peers and p not in handing]
        draining = [p for p in placement if p in handing or (p in peers and peers[p].state == PeerState.DRAINING)]
        # a joiner announces itself before it has probed its links: placed earlier, the others would wait for it
        joining = [p for p, r in peers.items() if p not in placement and r.state == PeerState.JOINING
                   and self.liveness.seen_for(p, now) >= SETTLE_SECONDS
                   and (r.links or self.liveness.seen_for(p, now) >= JOIN_PROBE_SECONDS)]
        if not gone and not joining and not draining:
            return self._swarm_periodic_replan(peers, now)
        in_force = self.epochs.in_force(self.completed)
        holders = set(in_force.data_holders)
        if self.plans.busy:  # planned once the re-plan under way is published; the peers hear of the dead at once
            return [Announce(m) for m in self.gone.tell(gone, self.schedule, self.completed)] + \
                self._commit_if_reported(now)
        change = (tuple(sorted(gone)), tuple(sorted(draining)), tuple(sorted(joining)))
        if self.plans.failed_lately(change, now):
            return []  # the same change could not be planned a moment ago (no data holder left): not every tick
        actions: list[Action] = [Announce(m) for m in self.gone.tell(gone, self.schedule, self.completed)]
        # a holder's draws of the iteration in progress are ledgered against the positions of the last commit: a
        # gone holder's are left out of its commit (the others' go on: `GoneNotices`); the iteration runs again when
        # no holder injecting microbatches is left or a holder is leaving (a draining holder is not announced gone)
        survivors = (injectors(in_force) & set(peers)) - {*gone, *draining}  # an excused one is not in the newest
        # a peer reported the iteration in progress unable to finish, too early to believe alone; a peer of its epoch
        # now gone corroborates it (as in `_restart_iteration`): it runs again, rather than waiting for its deadline
        unfinishable = bool(gone) and self._restart_reports.reported(self.completed, in_force.epoch)
        rerun = not survivors or bool(holders & set(draining)) or unfinishable
        start = self.completed if rerun else self.completed + 1
        if unfinishable:
            self._restart_reports.restarting(self.completed, in_force.epoch, now)
        logger.warning("membership changed (gone: %s, leaving: %s, joining: %s): re-planning from iteration %d",
                       gone, draining, joining, start,
                       extra=event("replanned", epoch=self.schedule.epoch, start_iteration=start, gone=gone,
                                   leaving=draining, joining=joining))
        live = {p: r for p, r in peers.items() if (p in placement or p in joining) and p not in draining}
        asked = self._replan(live, start=start, now=now, why="membership", handing_over=draining, change=change)
        return actions + asked + self._commit_if_reported(now)  # every other holder may have reported it

    def _kept_out(self, now: float) -> set[str]:
        """The live peers the plan leaves out now: sitting out an estrangement, or benched for being too slow."""
        return self.suspicions.estrangements.sitting_out(now) | self.slow.benched(now)

    def _swarm_periodic_replan(self, peers: dict[str, PeerRecord], now: float) -> list[Action]:
        """The SWARM-style planner's periodic re-plan of a stable swarm, from the next iteration (as for a joiner):
        once the epoch in force has run `SWARM_REPLAN_ITERATIONS` iterations and no newer one is waiting."""
        latest = self.schedule
        ran = self.completed - int(latest.meta.get("start_iteration", 0))
        if self.config.planner != "swarm" or ran < SWARM_REPLAN_ITERATIONS or self.plans.busy:
            return []
        start = self.completed + 1
        logger.info("SWARM-style planner: epoch %d has run %d iterations: rebalancing and rewiring from iteration %d",
                    latest.epoch, ran, start, extra=event("replanned", epoch=latest.epoch, start_iteration=start,
                                                          gone=[], leaving=[], joining=[]))
        return self._replan({p: r for p, r in peers.items() if p in latest.placement}, start=start, now=now,
                            why="periodic")

    # ---- plans --------------------------------------------------------------------------------------
    def _replan(self, peers: Mapping[str, PeerRecord], *, start: int, now: float, why: str,
                handing_over: Iterable[str] = (), change: tuple | None = None,
                drift: Mapping | None = None) -> list[Action]:
        """Ask for a new epoch of `peers` from iteration `start` (see `PlanJob` for the rest)."""
        return self._ask(self.plans.job(peers, why=why, start=start, completed=self.completed, epochs=self.epochs,
                                        shard_positions=self.commits.shard_positions, handing_over=handing_over,
                                        change=change, drift=drift), now)

    def _ask(self, job: PlanJob, now: float) -> list[Action]:
        return [MakePlan(job)] if self.plans.ask(job, self.replanner) else self.planned(job, now)

    def planned(self, job: PlanJob, now: float) -> list[Action]:
        """`job` (`MakePlan`) is made: publish its epoch (`PlanDesk.settle`), or make another; then judge what waited
        for it. Made while the epoch before it is being stored, it waits for that store (`PlanDesk.park`)."""
        if self.plans.park(job):
            return self._after_plan(now)
        settled = self.plans.settle(job, completed=self.completed, epochs=self.epochs,
                                    shard_positions=self.commits.shard_positions, evicted=self.suspicions.evicted,
                                    now=now, commit_in=self._restart_reports.due_in(now))
        if isinstance(settled, PlanJob):
            return self._ask(settled, now)
        return ([] if settled is None else self._publish(settled, now)) + self._after_plan(now)

    def stored(self, schedule: Schedule, ok: bool, now: float) -> list[Action]:
        """The owner stored `schedule` (`PublishSchedule`) in the DHT, or could not (`ok`: see `PlanDesk.stored`).
        The commits that waited for it go on."""
        self.plans.stored(schedule, ok, self.epochs, now)
        if (parked := self.plans.take_parked()) is not None:
            return self.planned(parked, now)
        return self._after_plan(now)

    def _after_plan(self, now: float) -> list[Action]:
        """Commit the iteration in progress if its holders all reported it (it may have waited for a store), then,
        once no re-plan is under way, judge the reports of an iteration unable to finish that came meanwhile."""
        actions = self._commit_if_reported(now)
        if self.plans.busy:
            return actions
        for sender, report in self.plans.take_deferred():
            actions += self._restart_iteration(sender, report, now)
        return actions

    def _publish(self, schedule: Schedule, now: float) -> list[Action]:
        schedule.meta["successors"] = successors(self.schedule, schedule, self.liveness.first_seen)
        schedule.meta["positions_after"] = self.completed - 1  # the commit its `shard_positions` are as of
        if slow := self.slow.to_meta(now):
            schedule.meta["slow"] = slow  # for a successor (`resume`)
        bridge = self.epochs.add(schedule, in_progress=self.completed)
        return [PublishSchedule(schedule, bridge, self.plans.publish(schedule, bridge, now))]

    # ---- reports ------------------------------------------------------------------------------------
    def handle(self, sender: str, message: ControlMessage, now: float) -> list[Action]:
        """A control message from `sender` (authenticated by the gossip layer; whether it may say this is checked
        here against the schedule)."""
        claimed = getattr(message, "peer", sender)
        if isinstance(message, (Join, Leave, Stuck, Broken, Unrecoverable, Done, Pace, Faulty)) and claimed != sender:
            logger.warning("ignored a %s report from %s in the name of %s", type(message).__name__.lower(), sender,
                           claimed)
            return []
        if isinstance(message, (Join, Leave)):
            logger.info("membership: %s %s", type(message).__name__.lower(), sender)
        elif isinstance(message, (Stuck, Unrecoverable)):
            return self._restart_iteration(sender, message, now)
        elif isinstance(message, Broken):
            return self.suspicions.broken(sender, message, self.epochs, self.completed, now)
        elif isinstance(message, Pong):
            self.suspicions.pong(sender, message.nonce, now)
        elif isinstance(message, Unreachable):
            return self.suspicions.unreachable(sender, message.peer, self.schedule, now)
        elif isinstance(message, Done):
            return self._note_done(sender, message, now)
        elif isinstance(message, Pace):
            return self._bench(self.slow.paced(message, self.epochs.get(message.epoch),
                                               self.liveness.records.get(sender), self.completed), now)
        elif isinstance(message, Faulty):
            return self.suspicions.faulty(sender, message, self.epochs)
        return []

    def check_pings(self, now: float) -> list[Action]:
        """Take the pings that waited their timeout out as witnesses against their peers (or ask again, after a mass
        silence: `Suspicions.expire_pings`). A placed peer declared gone since the last read (on a ping, a second
        report, a fault) is re-planned without at once: the next read of the records may be seconds away."""
        asked = self.suspicions.expire_pings(now, placed=len(self.schedule.placement) if self.schedule else 0)
        if self.schedule is None or self.liveness.declared_gone.isdisjoint(self.schedule.placement):
            return asked
        return asked + self._follow_membership({**self.liveness.live(now), **self.liveness.not_declared(
            self.schedule.placement)}, now)

    def _restart_iteration(self, sender: str, report: Stuck | Unrecoverable, now: float) -> list[Action]:
        """A scheduled peer reports the iteration in progress unable to finish: stuck past its deadline (a message
        was lost), or a microbatch its holder could not re-queue (no detour, or too many attempts broke). Run the
        iteration again under a new epoch on the live peers of the newest one, once per iteration and epoch."""
        if self.schedule is None or report.iteration != self.completed:
            return []
        if self.plans.busy:  # judged once the re-plan under way is published (it may run this iteration again itself)
            self.plans.defer(sender, report, keep=4 * len(self.schedule.placement))
            return []
        live = self.liveness.live(now)
        why = self._restart_reports.judge(sender, report, self.epochs.in_force(self.completed), live, now)
        if why is None:
            return []
        # peers reported unreachable are left out only once that is corroborated (see `Suspicions.broken`)
        peers = {q: r for q, r in live.items() if q in self.schedule.placement}
        return self._replan(peers, start=self.completed, now=now, why="restart")

    def _note_done(self, sender: str, report: Done, now: float) -> list[Action]:
        """A data holder finished its part of an iteration: commit the iteration once all of its epoch's have.
        A holder reports the positions of the shards its epoch gave it, and no others."""
        if self.schedule is None:
            return []
        if not self.epochs.ever_held(sender):
            logger.warning("ignored a progress report from %s: not a data holder of the schedule", sender)
            return []
        holder = self.liveness.records.get(sender)
        self.slow.done(report, self.epochs.get(report.epoch), holder)  # its passes' pace, even if committed without it
        why = self.commits.add(sender, report, own=self.epochs.shards_of(sender, report.epoch),
                               own_data=holder is not None and holder.data_holder, now=now)
        if why is not None:
            logger.warning("ignored a progress report from %s: %s", sender, why,
                           extra=event("ignored_control", sender=sender, kind="Done", why=why))
            return []
        return self._commit_if_reported(now)

    def check_late_holders(self, now: float) -> list[Action]:
        """Leave the holders late against the others out of the iteration in progress (`CommitTracker.late`), and
        commit it if the others all reported. They stay in the run: only their draws of this iteration go back (and
        the commit's `left_out`, which names them, has their stage mates probe them)."""
        if self.schedule is None:
            return []
        running = self.epochs.in_force(self.completed)
        late, behind = self.commits.late(self.completed, running, self._left_out(running),
                                         started=self._restart_reports.progress_at, now=now)
        if not late:
            return []
        self.commits.excuse_late(self.completed, running.epoch, late, behind)
        return self._commit_if_reported(now)

    def _left_out(self, running: Schedule) -> list[str]:
        """The peers of epoch `running` that a commit of it leaves out: evicted, declared gone, or told gone under
        it or a newer epoch."""
        told = self.gone.left_out(running)
        return [p for p in running.placement if p in self.suspicions.evicted or p in self.liveness.declared_gone
                or p in told]

    def _commit_if_reported(self, now: float) -> list[Action]:
        """Commit the iteration in progress if every holder of its epoch not left out of it has reported it, and no
        epoch the peers must read from the DHT, being stored, starts at the next iteration or earlier
        (`PlanDesk.holds`)."""
        if self.plans.holds(self.completed):
            return []
        running = self.epochs.in_force(self.completed)
        committed = self.commits.try_commit(self.completed, running, left_out=self._left_out(running))
        if committed is None:
            return []
        commit, reports = committed
        records = {p: r for p, r in self.liveness.records.items() if p in running.placement}
        record = iteration_metrics(self.completed, reports, epoch=running.epoch, peers_online=self.peers_online,
                                   records=records, left_out=commit.left_out)
        self.completed += 1
        self.suspicions.committed()
        self.gone.running(self.epochs.in_force(self.completed).epoch)
        self._restart_reports.progress(now, record["iteration_seconds"])
        # lateness in an iteration that lost a peer is the churn's (microbatches went around the dead), not slowness
        churned = set(commit.left_out) - self.commits.last_late
        moved, off = ({}, []) if churned or not self.config.holder_shares else \
            self.slow.holders.committed(self.schedule, self.commits.last_counted, self.commits.last_late)
        # the record first: see `RecordIteration`
        return [RecordIteration(record), Announce(commit)] + self._follow_pace(moved, off, now)

    def _follow_pace(self, moved: Mapping[str, ShareChange], off: list[str], now: float) -> list[Action]:
        """After a commit: take the holders of `off` off the run's work (`_bench`); else re-plan from the next
        iteration, on the same placement, for the holders whose microbatch count it changed (`SlowHolders`), or for
        costs that drifted from the newest epoch's (a peer's speed, a link), where that pays (`CostDrift`; not on a
        configured profile). Not while a placed peer is missing from the live ones: the membership's re-plan comes
        first (and plans with both)."""
        if off and (benched := self._bench(off, now)):
            return benched  # its re-plan plans every holder's share
        live, placement = self.liveness.live(now), self.schedule.placement
        if not set(placement) <= set(live) or self.plans.busy:  # shares moved now are planned by the next plan
            return []
        peers = {p: r for p, r in live.items() if p in placement}
        drift = {} if moved or self.config.profile else self.drift.drifted(self.schedule, peers)
        if not (moved or drift):
            return []
        start = self.completed + 1
        log_share_changes(moved, start)
        return self._replan(peers, start=start, now=now, why="pace", drift=drift or None)

    def _bench(self, peers: list[str], now: float) -> list[Action]:
        """Take `peers`, slow for good, off the run's work for a while (those `SlowPeers.bench` lets go; each is
        told) and re-plan without them from the next iteration, as for a peer sitting out: the one in progress goes on
        without them (a holder's draws go back, a relay's forwards go around it), or, for a relay that hands its stage
        over, as for a peer leaving."""
        live = self.liveness.live(now)
        told = self.slow.bench(peers, self.schedule, set(live) - self._kept_out(now), self.completed, now)
        return [Announce(m) for m in told] + self._follow_membership(live, now) if told else []

    def closing(self, stopped: bool) -> Finished | None:
        """What to tell the peers as this scheduler stops: the run is over if it reached its last iteration, or if
        its operator stopped the coordinator. A scheduler that dies without a word is replaced instead, and so is
        a peer holding the role that leaves: its run goes on."""
        epoch = self.schedule.epoch if self.schedule is not None else 0
        if self.done:
            return Finished(iterations=self.completed, epoch=epoch)
        if stopped and self.ends_run_on_stop:
            return Finished(iterations=self.completed, epoch=epoch, stopped=True)
        return None
