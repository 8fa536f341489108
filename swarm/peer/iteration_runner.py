"""`IterationRunner`: one peer's whole part of one iteration, from its first microbatch to its optimizer step.

1. its part of the pipeline (`PipelineExecutor`); a data holder draws its microbatches and, once they are done,
   reports `done` to the scheduler;
2. it waits for the scheduler's `commit` of the iteration (after which its samples count as processed), serving
   on meanwhile (a detour around a gone peer may still bring work);
3. its stage group's averaging (all-gather, or hivemind's averager) and one optimizer step; a checkpoint every
   `checkpoint_every` iterations.

Deadlines come from the `IterationClock`. A microbatch whose backward is overdue at this peer makes it probe the
peer it sent the forward to, and so does a stage mate whose averaging contribution is overdue: one that does not
answer in time is taken for unreachable (detoured around, not waited for by the averaging, and reported), and the
sends to it still under way are given up on (a silent host, frozen or cut off, never makes them fail); one that
answers but still holds the microbatch past the hop's stall limit has that attempt broken (`PipelineExecutor`: its
holder re-queues it around that peer, and the report counts against it). A newer
epoch that starts at the iteration in progress aborts it (IterationAborted), and so does the run finishing while
the peer is asked to stop; a commit without this peer, which the scheduler took off the run (benched, sitting out,
taken for gone) while it ran, passes it by (it neither averages nor steps: its mates average without it and send it
nothing); no commit in time is an IterationTimeout.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from peers.checkpoint import param_digest, save_stage_checkpoint
from scheduler.schedule import Schedule
from swarm.events import event
from swarm.net.transport import Transport, TransportError
from swarm.peer.awaited_backwards import AwaitedBackwards
from swarm.peer.console import IterationSummary, console_logger, iteration_line
from swarm.peer.data_holder import DataHolder
from swarm.peer.host_share import ThreadShare
from swarm.peer.inbound_checks import InboundChecks
from swarm.peer.iteration_clock import SILENCE_FLOOR, IterationClock
from swarm.peer.mailbox import Inbox, Outbox
from swarm.peer.pipeline import IterationAborted, IterationTimeout, PipelineExecutor
from swarm.peer.reports import Reports
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.peer.stage_session import StageSession
from swarm.peer.timeline import Timeline
from swarm.run_config import RunConfig
from swarm.stage_group.allgather import GroupRound, average_stage_group
from swarm.stage_group.lineage import chain, judge
from swarm.stage_group.mending import mend
from swarm.stage_group.parts_round import average_by_parts
from swarm.wire import Direction

logger = logging.getLogger(__name__)

COMMIT_TIMEOUT = 120.0
"""Seconds to wait for the scheduler's commit (or a replacing epoch) before giving up on the run, at least..."""
COMMIT_TIMEOUT_ITERATIONS = 4.0
"""...and at least this many of the schedule's predicted iterations (a 1.5B model's over a WAN take a minute)."""
MAX_PREDICTED_SECONDS = 900.0
"""A prediction counts up to this (a schedule predicting more still gives up within an hour)."""
MEND_INTERVAL = 4
"""Iterations between two mendings of one stray copy of a stage group (`IterationRunner._mend`)."""


def commit_timeout(schedule: Schedule) -> float:
    """Seconds a peer waits for the commit of an iteration of `schedule` (or an epoch replacing it)."""
    predicted = min(schedule.predicted_iteration_seconds or 0.0, MAX_PREDICTED_SECONDS)
    return max(COMMIT_TIMEOUT, COMMIT_TIMEOUT_ITERATIONS * predicted)


class IterationRunner:
    """Runs iterations for peer `peer_id` of a run configured by `config`.

    :param transport: returns the peer's transport (for probing a late next hop)
    :param stopping: whether the run is stopping while this peer is asked to stop (no commit will come)
    :param threads: sizes torch's threads before each iteration (None: left as they are)
    :param checks: the transport's inbound checks (told whom a stray of its stage group takes state from)
    :param unanswered: told of each peer a probe of this runner's found silent (`LinkWatch.suspect`)
    """

    def __init__(self, peer_id: str, run_id: str, config: RunConfig, *, inbox: Inbox, outbox: Outbox,
                 follower: ScheduleFollower, reports: Reports, clock: IterationClock, timeline: Timeline,
                 transport: Callable[[], Transport | None], stopping: Callable[[], bool],
                 averaging_deadline: float, checkpoint_dir: str | None = None, log_param_digest: bool = False,
                 threads: ThreadShare | None = None, checks: InboundChecks | None = None,
                 unanswered: Callable[[str], None] | None = None) -> None:
        self.peer_id, self.run_id, self.config = peer_id, run_id, config
        self.inbox, self.outbox, self.follower, self.reports = inbox, outbox, follower, reports
        self.clock, self.timeline = clock, timeline
        self._transport, self._stopping = transport, stopping
        self.averaging_deadline, self.checkpoint_dir = averaging_deadline, checkpoint_dir
        self.log_param_digest, self.threads, self.checks = log_param_digest, threads, checks
        self._unanswered = unanswered
        """Told of a peer that did not answer a probe (`LinkWatch.suspect`: dead, or its link congested)."""
        self.disproved: frozenset[str] = frozenset()
        """Relays whose report against another peer this peer found false in this epoch: gone around, so that one
        whose lie costs a stall limit costs it once per epoch, not every iteration (replaced, never mutated)."""
        self.unreachable: frozenset[str] = frozenset()
        """Peers no stream could be opened to since this peer adopted its schedule: detoured around like gone ones,
        and not waited for by the stage averaging (replaced, never mutated)."""
        self._probe_timeout = SILENCE_FLOOR
        """Seconds a probe of a peer in question waits (`IterationClock.probe_timeout` of the iteration's schedule)."""
        self._averaging = (float("inf"), float("inf"))
        """(When this peer's stage averaging started, seconds after which a silent stage mate is probed.)"""
        self._probed: set[str] = set()
        """Stage mates probed in this iteration's averaging."""
        self._given_up: frozenset[str] = frozenset()
        """Peers declared gone whose sends under way this peer gave up on, in this epoch."""
        self._mended: dict[str, int] = {}
        """Stray copies of this peer's stage group (this one's included) by the iteration they were last mended."""

    def new_epoch(self) -> None:
        """The scheduler's newer view is in use: a peer still unreachable fails (and is reported) again."""
        self.unreachable = frozenset()
        self.disproved = frozenset()
        self._given_up = frozenset()
        self.reports.new_epoch()

    def note_unreachable(self, peer: str, certain: bool = True) -> None:
        """A send to `peer` failed (`certain`: no stream could be opened at all): report it to the scheduler."""
        if certain:
            self.unreachable = self.unreachable | {peer}
        self.reports.unreachable(peer)  # before a broken microbatch is reported: the scheduler drops it then

    def run(self, session: StageSession, schedule: Schedule, iteration: int, data: DataHolder | None) -> None:
        """This peer's part of `iteration` under `schedule`, through its optimizer step."""
        worker, stage = session.worker, session.stage
        if self.threads is not None:
            self.threads.apply()  # peers that started on this machine since take their share of its cores
        self.timeline.take_compute()  # what an abandoned attempt computed is not this iteration's
        self._probe_timeout, self._probed = self.clock.probe_timeout(schedule), set()
        batches = data.draw(schedule, iteration) if stage == 0 and data is not None else {}
        executor = PipelineExecutor(me=self.peer_id, worker=worker, schedule=schedule, run_id=self.run_id,
                                    iteration=iteration, send=self.outbox.send, batches=batches,
                                    hold=self.inbox.hold, timeline=self.timeline,
                                    gone=lambda: self.follower.gone | self.unreachable | self.disproved,
                                    left_out=lambda: self.follower.gone,
                                    broken=self.reports.broken,
                                    give_up=lambda mb, why: self._give_up(iteration, schedule.epoch, mb, why),
                                    awaited=AwaitedBackwards(
                                        self.clock.hop_deadlines(schedule, self.peer_id), self._check_next_hop,
                                        self.clock.stall_limits(schedule, self.peer_id),
                                        lambda mb, seconds: self.clock.round_trip(schedule.epoch, mb, seconds)))
        t0 = time.perf_counter()
        result = executor.run(lambda t: self.inbox.receive("hop", t),
                              deadline=self.clock.iteration_deadline(schedule),
                              aborted=lambda: self._give_up_on_gone() or self.follower.replaced(iteration) or
                              self._stopping(),
                              settled=lambda: self.follower.is_committed(iteration, schedule.epoch))
        self.disproved = self.disproved | executor.disproved
        if stage == 0 and data is not None and not self.follower.is_committed(iteration, schedule.epoch):
            forwards, backwards, seconds = self.timeline.compute_so_far()  # a holder computes in its pipeline only
            self.reports.done(iteration, schedule.epoch, result, data.shards.positions(),  # else: left out, late
                              operations=forwards + backwards, compute=seconds)
        waited = time.time()
        self._wait_for_commit(executor, schedule, iteration)
        self.timeline.record("commit", waited, time.time(), iteration=iteration)
        if stage > 0:  # a relay: how quick its passes were, which no holder's report tells (`SlowRelays`); only a
            forwards, backwards, seconds = self.timeline.compute_so_far()  # committed iteration's pace counts
            self.reports.pace(iteration, schedule.epoch, forwards + backwards, seconds)
        for mb in worker.stashed:  # committed: every holder's microbatches finished, so these went another way
            logger.info("microbatch %d's stashed forward is dropped: it was re-queued around this peer", mb)
            worker.drop(mb)
        if stage == 0 and data is not None:
            data.settle(iteration, self.follower.left_out(iteration), result.requeued)
        if self.peer_id in self.follower.gone:  # benched, sitting out, or taken for gone by mistake
            logger.warning("iteration %d committed without this peer, which the scheduler took off the run while it "
                           "ran: its stage averages without it (and its mates send it nothing), so it goes on without "
                           "averaging or stepping", iteration)
            worker.reset()  # its gradients of the iteration go (its draws went back with the commit)
            return
        self._unlearn_left_out(session, schedule, iteration)
        t1 = time.perf_counter()
        group = schedule.stage_peers(stage)
        self._probe_left_out(group, iteration)
        self._averaging = (time.monotonic(), self.clock.averaging_overdue(schedule))
        round_ = None
        if self.config.averaging == "hivemind":
            visits, heard = session.average_with_hivemind(len(group), self.averaging_deadline,
                                                          left_out=self.peer_id in self.follower.left_out(iteration))
        else:
            average = average_by_parts if self.config.averaging == "parts" else average_stage_group
            round_ = average(me=self.peer_id, worker=worker, group=group, run_id=self.run_id, iteration=iteration,
                             epoch=schedule.epoch, send=self.outbox.send,
                             receive=lambda t: self.inbox.receive("average", t), deadline=self.averaging_deadline,
                             scheduled=schedule.visits(), left_out=self.follower.left_out(iteration),
                             alive=self._worth_waiting_for, hold=self.inbox.hold,
                             faulty=lambda suspect, why: self.reports.faulty(suspect, iteration, schedule.epoch, why),
                             lineage=session.lineage, wire_dtype=self.config.average_dtype, late=self._late_mate,
                             tell=functools.partial(self.outbox.send, report=False))
            visits, heard = round_.visits, round_.heard
        t2 = time.perf_counter()
        self.timeline.record("average", time.time() - (t2 - t1), time.time(), iteration=iteration)
        stats = worker.step()
        if self.config.averaging == "hivemind":
            session.resync_state(self.averaging_deadline)  # a no-op unless the round asked its members for it
        else:
            self._mend(session, schedule, iteration, round_)
        t3 = time.perf_counter()
        self._checkpoint(session, schedule, iteration + 1, data)
        self.timeline.flush()
        if getattr(worker, "overruns", 0):
            logger.warning("compute emulation: %d operations so far took longer than the emulated device",
                           worker.overruns)
        if result.detours:
            logger.warning("iteration %d: %d forwards of this peer went around gone peers", iteration, result.detours)
        if result.left_out:
            logger.info("iteration %d: %d forwards, backwards or stashed activations of holders declared gone were "
                        "dropped unrun", iteration, result.left_out)
        if result.requeued:
            logger.warning("iteration %d: %d microbatches of this holder's were re-queued after a peer on their path "
                           "died", iteration, len(result.requeued))
        logger.info("iteration %d done: %d backward passes, stage %d averaged %d visits from %d/%d peers, lr %.2e "
                    "(pipeline+commit %.3f s, averaging %.3f s, step %.3f s)", iteration, result.backward_done,
                    stage, visits, heard, len(group), stats.lr, t1 - t0, t2 - t1, t3 - t2)
        forwards, backwards, compute = self.timeline.take_compute()
        batch, seq_len = self.config.data.batch_size, self.config.data.seq_len
        console_logger.info("%s", iteration_line(IterationSummary(
            iteration=iteration, stage=stage, epoch=schedule.epoch, forwards=forwards, backwards=backwards,
            compute_seconds=compute, seconds=t3 - t0, tokens=forwards * batch * (seq_len - 1))))

    def _mend(self, session: StageSession, schedule: Schedule, iteration: int, round_: GroupRound) -> None:
        """After the step: if the round's lineages show copies of the stage that went apart, the strays take the
        holders' state (`swarm.stage_group.mending`), each at most once per `MEND_INTERVAL` iterations (a member
        that claims a new lineage every round must not cost its group a state transfer each); then chain this
        copy's lineage over the round."""
        mine, verdict = session.lineage, judge(round_.lineages)
        if self.peer_id in self.follower.left_out(iteration):  # its mates never saw its lineage: none mends it now
            session.lineage = chain(mine, verdict, None, iteration, round_.contributors)
            return
        due = tuple(p for p in verdict.strays if iteration - self._mended.get(p, -MEND_INTERVAL) >= MEND_INTERVAL)
        self._mended.update(dict.fromkeys(due, iteration))
        mended = None
        if due:
            mended = mend(me=self.peer_id, worker=session.worker, verdict=replace(verdict, strays=due),
                          run_id=self.run_id, iteration=iteration, epoch=schedule.epoch, send=self.outbox.send,
                          receive=lambda t: self.inbox.receive("state", t), timeout=self.averaging_deadline,
                          expect=self.checks.expect_state if self.checks is not None else None,
                          progress=lambda: self.inbox.assembly.arrived[Direction.STATE])
            if mended is not None and self.checks is not None:
                self.checks.online()  # takes no more state from anyone
        session.lineage = chain(mine, verdict, mended, iteration, round_.contributors)

    def _checkpoint(self, session: StageSession, schedule: Schedule, done: int, data: DataHolder | None) -> None:
        if self.checkpoint_dir and self.config.checkpoint_every and done % self.config.checkpoint_every == 0:
            save_stage_checkpoint(self.checkpoint_dir, session.worker, iteration=done, seed=self.config.seed,
                                  shard=data.shards.first() if data is not None else None,
                                  extra={"run_id": self.run_id, "peer": self.peer_id, "epoch": schedule.epoch,
                                         "data": self.config.data.to_dict()})  # for `skippipe gather`, eval
            logger.info("checkpoint of stage %d at iteration %d written to %s", session.stage, done,
                        self.checkpoint_dir)
        if self.log_param_digest:
            digest = param_digest(session.worker)
            logger.info("params iteration %d stage %d digest %s", done - 1, session.stage, digest,
                        extra=event("param_digest", iteration=done - 1, stage=session.stage, digest=digest))

    def _wait_for_commit(self, executor: PipelineExecutor, schedule: Schedule, iteration: int) -> None:
        """Block until the scheduler commits `iteration`; a replacing epoch aborts it instead. Meanwhile keep
        serving the iteration: a detour around a gone peer of this stage may still bring work here."""
        timeout = commit_timeout(schedule)
        end = time.monotonic() + timeout
        while not self.follower.is_committed(iteration, schedule.epoch):
            self._give_up_on_gone()
            if self.follower.replaced(iteration):
                raise IterationAborted(f"iteration {iteration} replaced before its commit")
            if self._stopping():
                raise IterationAborted(f"iteration {iteration} abandoned: the run is stopping")
            if time.monotonic() > end:
                raise IterationTimeout(f"no commit of iteration {iteration} within {timeout:.0f} s")
            executor.handle(self.inbox.receive("hop", 0.2))
        self.follower.forget_commits_before(iteration)
        self.clock.committed(time.monotonic())

    def _give_up(self, iteration: int, epoch: int, microbatch: int, why: str) -> None:
        """A microbatch of this holder's cannot be re-queued: the scheduler is to run the iteration again."""
        self.reports.unrecoverable(iteration, epoch, microbatch, why)
        self.follower.await_replacement(iteration)

    def _give_up_on_gone(self) -> bool:
        """Give up on the sends under way to peers the scheduler declared gone since the last look (a silent one
        never fails them): they come back undelivered and their microbatches are re-queued around it. False."""
        fresh = self.follower.gone - self._given_up
        transport = self._transport() if fresh else None
        if transport is not None:
            self._given_up = self._given_up | fresh
            for peer in fresh:
                cut = transport.abandon(peer)
                if cut:
                    logger.warning("%s was declared gone: gave up on %d sends to it", peer, cut)
        return False

    def _worth_waiting_for(self, peer: str) -> bool:
        """Whether the stage averaging should still wait for `peer`: not gone, reachable, and in the newest epoch."""
        if peer in self.follower.gone or peer in self.unreachable:
            return False
        newer = self.follower.poll_newer()
        if newer is not None and peer not in newer.placement:
            return False
        since, overdue = self._averaging
        if time.monotonic() - since > overdue and peer not in self._probed:
            self._probed.add(peer)
            self._probe(peer, f"{peer}'s averaging contribution is {overdue:.1f} s late")
        return True

    def _probe_left_out(self, group: list[str], iteration: int) -> None:
        """Probe the stage mates the commit of `iteration` left out that are not known gone: holders late against
        the others (`CommitTracker.late`). A frozen one is found now, by its mates' unanswered probes, rather than by
        its record's expiry; a slow one answers, and stays."""
        for peer in sorted(self.follower.left_out(iteration) - self.follower.gone - {self.peer_id}):
            if peer in group and peer not in self._probed:
                self._probed.add(peer)
                self._probe(peer, f"{peer} was left out of iteration {iteration}'s commit for being late")

    def _unlearn_left_out(self, session: StageSession, schedule: Schedule, iteration: int) -> None:
        """Take the microbatches of the holders the commit of `iteration` left out back out of this relay's gradient:
        the iteration counts none of them, and their samples are drawn and learnt again (twice, otherwise, at this
        stage). A left-out holder's own stage 0 takes nothing from it (it averages with weight 0)."""
        left_out = self.follower.left_out(iteration)
        if not left_out or not session.worker.learnt:  # most commits leave nobody out
            return
        origin = {r.microbatch: r.origin for r in schedule.routes}
        taken = [mb for mb in session.worker.learnt if origin.get(mb) in left_out and session.worker.unlearn(mb)]
        if taken:
            logger.info("iteration %d: microbatches %s of holders the commit left out taken back out of stage %d's "
                        "gradient", iteration, taken, session.stage,
                        extra=event("unlearnt", iteration=iteration, microbatches=taken))

    def _late_mate(self, peer: str, seconds: float) -> None:
        """A stage mate's averaging contribution is late against its mates': probe it now, not an iteration in."""
        if peer not in self._probed:
            self._probed.add(peer)
            self._probe(peer, f"{peer}'s averaging contribution is {seconds:.1f} s late against its mates'")

    def _check_next_hop(self, peer: str, microbatch: int) -> None:
        """A microbatch sent to `peer` is overdue: probe `peer` off the main loop. One that does not answer is
        taken for gone (the executor reports the microbatch broken, the scheduler hears that it is unreachable);
        one that answers is slow, or waits on a hop further on, whose own upstream peer checks it."""
        self.outbox.submit(lambda: self._check(peer, f"microbatch {microbatch} is overdue at {peer}"))

    def _probe(self, peer: str, why: str) -> None:
        """Probe `peer`, in question because of `why`, on a thread of its own (the sender threads may all be held
        up by sends to it)."""
        threading.Thread(target=self._check, args=(peer, why), name="skippipe-check", daemon=True).start()

    def _check(self, peer: str, why: str) -> bool:
        """Whether `peer` acknowledges a one-byte probe within the probe timeout; if not, it is taken for unreachable
        and the sends to it still under way are given up on (they come back undelivered)."""
        transport = self._transport()
        if transport is None:
            return False
        try:
            transport.probe(peer, 1, timeout=self._probe_timeout)
            logger.info("%s, but it answers: waiting on", why)
            return True
        except TransportError as e:
            logger.warning("%s, which does not answer (%s): taking it for gone", why, e)
            self.note_unreachable(peer)
            if self._unanswered is not None:
                self._unanswered(peer)
            cut = transport.abandon(peer)
            if cut:
                logger.warning("gave up on %d sends to %s", cut, peer)
            self.inbox.wake()  # the executor finds the microbatch broken
            return False
