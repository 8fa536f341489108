"""`SchedulerRole`: the scheduler at work in a process, the coordinator's or a successor peer's.

It carries out what its `Scheduler` decides: reads the peers' records from the DHT (off its loop, through a
`RecordsPoller`: a read stuck on a silent node must not hold up the commits), gossips each new schedule epoch (its
notice carries it) and stores it there (for joiners and peers that missed the notice), gossips notices and commits, and
writes the schedules and the metrics file. Once a heartbeat it gossips that it is alive (`Alive`). Control messages
reach it through `deliver` (the owner's gossip callback), into a bounded inbox that its `tick` drains; a full inbox
drops the newest message with a warning, so a flood cannot grow memory. The beat comes from a thread of its own
(`AliveBeat`). Re-plans and each epoch's DHT store run off the loop too (`MakePlan`, `PublishSchedule`: a thread each,
one at a time), and what they come back with is taken on the loop: the commits, pings and reads of the records go on
meanwhile (a re-plan of 20 peers held the loop a median 9-10 s on a loaded host).
Both owners build it with the same constructor: the coordinator ticks it from the start (it plans the first
epoch), a successor peer first calls `resume` with the epochs it knew. The coordinator's role, finding the run gone
on under a successor while it was away (`Overtaking`), stands down: it plans, commits and beats no more (it still
admits joiners, as the run's certificate issuer), and is done once it hears the run is over (a successor's role
gives itself back through its peer's follower instead, `Succession`).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from hivemind.utils import get_dht_time

from scheduler.schedule import Schedule
from swarm.constants import record_lifetime, silent_after
from swarm.control.gossip import GossipClient, GossipMessage
from swarm.control.membership import AdmissionPolicy
from swarm.control.messages import (
    Alive,
    ControlMessage,
    Done,
    Finished,
    Join,
    ScheduleNotice,
    as_gossip,
    publish,
    received,
)
from swarm.control.records import SwarmRecords
from swarm.coordinator.actions import Action, Announce, MakePlan, PublishSchedule, RecordIteration
from swarm.coordinator.admission_desk import AdmissionDesk
from swarm.coordinator.alive_beat import AliveBeat
from swarm.coordinator.away_watch import AwayWatch
from swarm.coordinator.overtaking import Overtaking
from swarm.coordinator.plan_job import PlanJob
from swarm.coordinator.records_poller import Records, RecordsPoller
from swarm.coordinator.scheduler import Scheduler
from swarm.events import event
from swarm.run_config import RunConfig
from swarm.wire import RunSpec, ScheduleMsg, WireError

logger = logging.getLogger(__name__)

INBOX_SIZE = 4096
"""Control messages waiting for the role's loop; more are dropped (and logged)."""
TICK_WAIT = 0.5
"""Seconds one tick waits for a control message before the next look at the records."""
READS_PER_HEARTBEAT = 4
"""How often per heartbeat period the scheduler reads the peers' records (each changes once a period)."""


def records_read_period(heartbeat: float) -> float:
    """Seconds between two reads of the peers' records: every tick in a swarm that beats fast, a few times per
    heartbeat in one that beats slowly. Each read is a DHT lookup that fetches every peer's record from several
    nodes, which each answer with the whole dictionary: read twice a second in a 20-peer swarm beating every 15 s,
    that was most of the DHT's work and bought nothing, since a record changes once a heartbeat. A death is still
    seen within a quarter of a heartbeat of its record's verdict, far below the 2.5 heartbeats it takes."""
    return max(TICK_WAIT, heartbeat / READS_PER_HEARTBEAT)


MAX_STORED_SCHEDULE_BYTES = 2 * 1024 * 1024 - 64 * 1024
"""The largest schedule message stored with a bridge. hivemind refuses unary messages over 4 MiB, and a DHT find
answers with every signer's record under the key at once (the coordinator's and a successor's, for an hour after a
succession): each must stay under half of it, with room for its signed envelope. A 20-peer schedule is ~30 KB."""
STORE_ATTEMPTS = 2
"""Tries at storing an epoch its notice carried: the peers have it, and the DHT only serves joiners and peers that
missed the notice, so a store that timed out on a loaded DHT is tried again rather than the epoch planned again."""


class SchedulerRole:
    """The scheduler of run `spec`, acting through `records` (the DHT) and `gossip`.

    :param peer_id: the id of the process holding the role (the sender of what it gossips)
    :param run_dir: where each published schedule is written as `schedule-EPOCH.json` (None: nowhere)
    :param metrics_path: where one JSON line per committed iteration is appended (None: the log only)
    :param first_schedule: a saved plan to start from (see `Scheduler`)
    :param local: hands what the role gossips to its own process too (gossip does not deliver a publisher's own
      messages back to it): a successor peer's gossip callback
    :param ends_run_on_stop: whether stopping the role ends the run (the coordinator process)
    :param token: the run's join token, if this process holds it (it admits token holders: see `AdmissionDesk`)
    """

    def __init__(self, config: RunConfig, spec: RunSpec, peer_id: str, records: SwarmRecords, gossip: GossipClient,
                 *, run_dir: str | Path | None = None, metrics_path: str | Path | None = None,
                 first_schedule: Schedule | None = None, local: Callable[[GossipMessage], None] | None = None,
                 ends_run_on_stop: bool = True, token: str | None = None) -> None:
        self.config, self.spec, self.peer_id = config, spec, peer_id
        policy = AdmissionPolicy(spec.admission, token, frozenset(spec.allowed))
        self.records, self.gossip, self.local = records, gossip, local
        self.run_dir = Path(run_dir) if run_dir else None
        self.metrics_path = Path(metrics_path) if metrics_path else None
        self.scheduler = Scheduler(config, spec.model, spec.coordinator, first_schedule=first_schedule,
                                   ends_run_on_stop=ends_run_on_stop, background_plans=True)
        self.desk = AdmissionDesk(policy, records.identity, config.run_id, exempt={spec.coordinator},
                                  issuers={spec.coordinator}, banned=self.scheduler.suspicions.evicted)
        self._inbox: queue.Queue[tuple[GossipMessage | None, float]] = queue.Queue(INBOX_SIZE)
        """Control messages, each with when it came (monotonic); None wakes the loop for work done off it."""
        self._done_off_loop: queue.SimpleQueue[Callable[[], list[Action]]] = queue.SimpleQueue()
        """What a plan or a store made off the loop hands back to it (`_off_loop`)."""
        self.poller = RecordsPoller(self._fetch, period=records_read_period(config.heartbeat))
        """Reads the records for `tick` (started by the first tick, stopped by `close`)."""
        self.alive = AliveBeat(config.heartbeat, self._alive, self._announce)
        """Gossips that this scheduler is alive once a heartbeat (started by the first tick, stopped by `close`)."""
        self._coordinator = peer_id == spec.coordinator
        """Whether this is the coordinator's role, the one that stands down when it finds itself overtaken (a
        successor's gives itself back through its peer's follower)."""
        self.overtaking = Overtaking()
        self.away = AwayWatch(silent_after(config.heartbeat))
        """Whether this process was not run at all for longer than a record lives (the coordinator's: started by
        its first tick)."""
        self._listen_until = 0.0
        self._held: list[tuple[str, ControlMessage]] = []
        """Control messages that came while the coordinator listened (`tick`), taken once it has."""
        self.stood_down = False
        """Whether the run went on under another scheduler while this one was away (`Overtaking`)."""
        self._run_over = False
        """Once stood down: whether the run's end was heard (`Finished`), or every peer's record is gone."""

    @property
    def done(self) -> bool:
        return self.scheduler.done or self._run_over

    def deliver(self, msg: GossipMessage) -> None:
        """Hand the role a gossip message (any thread); a full inbox drops it."""
        try:
            self._inbox.put_nowait((msg, time.monotonic()))
        except queue.Full:
            logger.warning("the scheduler's inbox is full: dropped a message from %s", msg.sender)

    def resume(self, schedules: Iterable[Schedule], completed: int,
               shard_positions: Mapping[str, dict] | None = None) -> None:
        """Take the role over from a dead scheduler (see `Scheduler.resume`)."""
        self._carry_out(self.scheduler.resume(schedules, completed, self._read_records(), time.monotonic(),
                                              shard_positions=shard_positions))

    def tick(self) -> None:
        """One round: look at the newest read of the peers' records, if one came since the last look, then handle
        the control messages that came meanwhile, then the pings whose answer is overdue (and the deaths declared
        meanwhile), then the data holders late against the others. It never waits on the DHT:
        a read that fails (it times out on a loaded host) or is slow (a silent node) skips a look, and no read is not
        an empty swarm. Back from longer away than a record lives (its host frozen or cut off: `AwayWatch`, not a
        slow step of its own), the coordinator only listens for as long again (the messages that come wait) before
        it judges the records it missed, the reports or the iteration it left: the run may have gone on under a
        successor (`Overtaking`)."""
        self.alive.start().turned()
        self.away.start()
        listening = self._listening()
        records = self.poller.start().take()
        if self.stood_down:  # it plans, commits and beats no more; it still admits joiners (the run's issuer)
            if records is not None:
                self._members(records)
                self._run_over = self._run_over or not set(records) - {self.peer_id}  # every peer left
            self._drain(TICK_WAIT)
            return
        if not listening:
            self._take_done_off_loop()
        if records is not None and not listening:
            self._carry_out(self.scheduler.observe(self._members(records), time.monotonic()))
        if not listening and self._held:  # it listened, and nothing said the run went on without it
            held, self._held = self._held, []
            for sender, message in held:
                self._take(sender, message)
        self._drain(TICK_WAIT)
        if self.stood_down:
            return
        if not self._listening():
            self._carry_out(self.scheduler.check_pings(time.monotonic()))
            self._carry_out(self.scheduler.check_late_holders(time.monotonic()))

    def _listening(self) -> bool:
        """Whether this coordinator only listens, back from longer away than a record lives (`AwayWatch`): asked
        before anything it would decide, since a thawed loop may take a message before the watch's thread looks."""
        away = self.away.take() if self._coordinator else 0.0
        if away:
            self._listen_until = time.monotonic() + silent_after(self.config.heartbeat)
            logger.warning("this coordinator was away for %.0f s: it listens for %.0f s before it decides anything "
                           "(a successor may have taken over)", away, silent_after(self.config.heartbeat))
        return time.monotonic() < self._listen_until

    def _alive(self) -> Alive | None:
        """This scheduler's beat (`AliveBeat`, any thread): once a run is planned, until it stands down or is done.
        The peers' watch also reads its DHT record, but a loaded DHT's stores time out, and a peer that took a live
        scheduler for dead moved on to its successor."""
        schedule = self.scheduler.schedule  # one read: the loop may be replacing it
        if schedule is None or self.stood_down or self.done:
            return None
        return Alive(epoch=schedule.epoch, iteration=self.scheduler.completed)

    def close(self) -> None:
        """Stop reading the records and watching the clock (the owner's loop is over)."""
        self.poller.stop()
        self.away.stop()
        self.alive.stop()

    def finish(self, stop: threading.Event) -> None:
        """Tell the peers the run is over, if it is (see `Scheduler.closing`); after its last iteration, stay on
        the control plane until the peers have taken the last commit and left."""
        message = None if self.stood_down else self.scheduler.closing(stop.is_set())
        if message is None:
            return
        logger.info("run %s %s after %d iterations", self.config.run_id,
                    "stopped" if message.stopped else "finished", message.iterations)
        self._announce(message)
        if not message.stopped:
            self._linger(stop)

    def _linger(self, stop: threading.Event, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < end:
            records = self._try_read_records()
            if records is not None:
                live = self.scheduler.liveness.update(records, time.monotonic())
                if not any(p in self.scheduler.schedule.placement for p in live):
                    return
            self._drain(TICK_WAIT)

    def _try_read_records(self) -> dict | None:
        """`_read_records`, or None (logged) when the DHT did not answer."""
        try:
            return self._read_records()
        except Exception as e:  # a timeout, a daemon hiccup: the next tick reads again
            logger.warning("could not read the peers' records: %s: %s", type(e).__name__, e)
            return None

    def _read_records(self) -> dict:
        """The members' records, read now."""
        return self._members(self._fetch())

    def _fetch(self) -> Records:
        return self.records.fetch_peers_with_age(record_lifetime(self.config.heartbeat))

    def _members(self, records: Records) -> dict:
        """The members among `records`; joiners are admitted or refused on the way (see `AdmissionDesk`)."""
        members, messages = self.desk.sort(records, get_dht_time())
        for message in messages:
            self._announce(message)
        return members

    def _drain(self, timeout: float) -> None:
        try:
            msg, came = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            if msg is None:  # a plan or a store is done
                if not self.stood_down and not self._listening():
                    self._take_done_off_loop()
            else:
                self._receive(msg, came)
            try:
                msg, came = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _receive(self, msg: GossipMessage, came: float) -> None:
        try:
            message = received(msg, self.config.run_id)
        except WireError as e:
            logger.warning("ignored a control message from %s: %s", msg.sender, e,
                           extra=event("ignored_control", sender=msg.sender, kind="malformed", why=str(e)))
            return
        self._listening()  # an absence is known before a message that came after it is judged
        if came >= self._listen_until:  # not one that waited while this process was away
            self.scheduler.liveness.heard_from(msg.sender, msg.seqno, came)
        self._take(msg.sender, message)

    def _take(self, sender: str, message: ControlMessage) -> None:
        """Act on one control message from `sender` (once stood down: answer joins, and hear whether the run is
        over)."""
        if isinstance(message, Join) and message.peer == sender:
            refusal = self.desk.answer_join(message, get_dht_time())
            if refusal is not None:
                self._announce(refusal)
        if self.stood_down:  # the run's end, from a peer it placed (its successor is one)
            placed = self.scheduler.schedule is not None and sender in self.scheduler.schedule.placement
            self._run_over = self._run_over or (isinstance(message, Finished) and placed)
            return
        if isinstance(message, Done) and self._coordinator and \
                self.overtaking.note(sender, message, self.scheduler.schedule, self.scheduler.completed):
            self._stand_down()
            return
        if self._listening():  # back from away: what it would decide on this waits
            if len(self._held) < INBOX_SIZE:
                self._held.append((sender, message))
            else:
                logger.warning("the coordinator listens, and holds %d messages already: dropped a %s from %s",
                               INBOX_SIZE, type(message).__name__, sender)
            return
        try:
            self._carry_out(self.scheduler.handle(sender, message, time.monotonic()))
        except Exception:  # one message must never take the scheduler down: logged and dropped
            logger.exception("dropped a %s from %s: handling it failed", type(message).__name__, sender)

    def _stand_down(self) -> None:
        completed = self.scheduler.completed
        logger.warning("the run went on without this coordinator: most of its peers report iterations past %d, its "
                       "iteration in progress (a successor took over while it was away); it stands down rather than "
                       "compete, and stays on the control plane (DHT, gossip) until the run is over",
                       completed, extra=event("scheduler_stood_down", iteration=completed))
        self.stood_down, self._held = True, []

    # ---- actions ------------------------------------------------------------------------------------
    def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, MakePlan):
                self._off_loop(f"plan {action.job.number}", self._make_plan(action.job))
            elif isinstance(action, PublishSchedule):
                if action.notice.schedule:  # the peers take the epoch from its notice: its store holds nothing up
                    self._published(action.schedule, action.notice)
                self._off_loop(f"epoch {action.schedule.epoch}'s store", self._store(action))
            elif isinstance(action, Announce):
                self._announce(action.message)
            elif isinstance(action, RecordIteration):
                self._record(action.record)

    def _off_loop(self, what: str, work: Callable[[], Callable[[], list[Action]]]) -> None:
        """Run `work` in a thread of its own; what it returns is called back on the loop (`_take_done_off_loop`).
        `work` never raises: the scheduler waits for what it hands back (a failure is an outcome of its own)."""
        def run() -> None:
            self._done_off_loop.put(work())
            try:
                self._inbox.put_nowait((None, time.monotonic()))  # wakes the loop; a full inbox wakes it anyway
            except queue.Full:
                pass

        threading.Thread(target=run, daemon=True, name=f"skippipe-{what.split()[0]}").start()

    def _take_done_off_loop(self) -> None:
        while True:
            try:
                done = self._done_off_loop.get_nowait()
            except queue.Empty:
                return
            try:
                self._carry_out(done())
            except Exception:  # as for a message (`_take`): logged, and the scheduler goes on
                logger.exception("taking a plan or a store made off the loop failed")

    def _make_plan(self, job: PlanJob) -> Callable[[], Callable[[], list[Action]]]:
        def work() -> Callable[[], list[Action]]:
            try:
                job.run(self.scheduler.replanner)  # the planner's own errors are an outcome
            except Exception as e:  # a bug: logged in full, and given up like a plan that could not be made
                logger.exception("plan %d failed", job.number)
                job.outcome = e
            return lambda: self.scheduler.planned(job, time.monotonic())
        return work

    def _store(self, action: PublishSchedule) -> Callable[[], Callable[[], list[Action]]]:
        """Store the epoch: once, where the peers wait to read it (a failure has it planned again), or up to
        STORE_ATTEMPTS times where its notice carried it (the peers have it: the DHT serves joiners and peers that
        missed the notice)."""
        schedule = action.schedule
        attempts = STORE_ATTEMPTS if action.notice.schedule else 1

        def work() -> Callable[[], list[Action]]:
            stored = False
            for _ in range(attempts):
                try:
                    stored = self._store_schedule(schedule, action.bridge)
                except Exception:  # a DHT daemon gone: not stored
                    logger.exception("storing schedule epoch %d failed", schedule.epoch)
                if stored:
                    break
            return lambda: self._stored(action, stored)
        return work

    def _store_schedule(self, schedule: Schedule, bridge: Schedule | None) -> bool:
        msg = ScheduleMsg.from_schedule(schedule, bridge)
        if bridge is not None and len(msg.to_msgpack()) > MAX_STORED_SCHEDULE_BYTES:
            logger.warning("schedule epoch %d with epoch %d as its bridge does not fit in a DHT store: stored "
                           "without it", schedule.epoch, bridge.epoch)
            msg = ScheduleMsg.from_schedule(schedule)
        return self.records.publish_schedule(msg)

    def _stored(self, action: PublishSchedule, stored: bool) -> list[Action]:
        """On the loop, after an epoch's store: announce it if the notice waited for the store; the commits that
        waited go on."""
        schedule, carried = action.schedule, bool(action.notice.schedule)
        if stored and not carried:
            self._published(schedule, action.notice)
        elif not stored and carried:
            logger.error("could not store schedule epoch %d in the DHT: the peers have it from its notice; joiners "
                         "and peers that missed the notice read the one before until the next epoch", schedule.epoch)
        elif not stored:
            logger.error("could not store schedule epoch %d in the DHT: re-planning at the next read of the records",
                         schedule.epoch)
        return self.scheduler.stored(schedule, stored, time.monotonic())

    def _published(self, schedule: Schedule, notice: ScheduleNotice) -> None:
        if self.run_dir:
            (self.run_dir / f"schedule-{schedule.epoch}.json").write_text(schedule.to_json())
        paths = len({(r.origin, r.stages, r.peers) for r in schedule.routes})
        logger.info("schedule epoch %d from iteration %d: %d peers, %d microbatches on %d distinct paths, predicted "
                    "%.3f s/iteration, planned in %.2f s", schedule.epoch, schedule.meta["start_iteration"],
                    len(schedule.placement), len(schedule.routes), paths,
                    schedule.predicted_iteration_seconds or float("nan"), schedule.meta.get("plan_seconds", 0.0))
        self._announce(notice)

    def _announce(self, message: ControlMessage) -> None:
        publish(self.gossip, self.config.run_id, message)
        if self.local is not None:
            self.local(as_gossip(message, self.config.run_id, self.peer_id))

    def _record(self, record: dict) -> None:
        logger.info("iteration %(iteration)d  loss %(loss).4f  %(tokens_per_s)s tokens/s  %(iteration_seconds).3f s  "
                    "%(peers_online)d peers  epoch %(epoch)d", record)
        if self.metrics_path:
            with self.metrics_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
