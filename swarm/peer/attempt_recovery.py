"""`AttemptRecovery`: what a peer does, within one iteration, when a microbatch attempt cannot finish.

A microbatch whose activations a gone peer held cannot finish its backward pass. The peer that finds it (a failed
send, a next hop gone or holding it past its stall limit) ends that attempt here and reports it; its data holder
re-queues it at once on its route around the peer it broke at (a new `attempt`; messages of earlier ones are
stale). Stages whose gradient already holds it (those its backward had passed, when its loss had been computed)
run it again without accumulating, so every stage counts it at most once. A holder that cannot re-queue it (no
detour obeys the rules, or `MAX_MICROBATCH_ATTEMPTS` reached) gives up: the iteration runs again. A relay told of
a break further along drops what it keeps of that attempt. A holder whose new attempt went through the very peer a
relay blamed, and came back, reports the relay instead (its word was false).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from peers.worker import StageWorker
from scheduler.schedule import Route, Schedule
from swarm.constants import MAX_MICROBATCH_ATTEMPTS
from swarm.events import event
from swarm.peer.attempts import Attempts, Requeue, peers_to_avoid, requeued_route
from swarm.peer.awaited_backwards import AwaitedBackwards
from swarm.peer.iteration_result import IterationResult
from swarm.peer.operation_queue import OperationQueue

logger = logging.getLogger(__name__)

Broken = Callable[[Requeue], None]
"""broken(report): an attempt of a microbatch of this iteration cannot finish (its activations died with a peer);
the report is for its data holder."""
GiveUp = Callable[[int, str], None]
"""give_up(microbatch, why): this holder cannot re-queue its microbatch: the iteration must be run again."""


class AttemptRecovery:
    """Ends broken attempts on one peer and, at their holder, starts the next one.

    Shares the executor's state for this iteration (its worker, queue, awaited backwards, routes in use, owed
    backwards and result), which it changes only as a break requires."""

    def __init__(self, *, me: str, schedule: Schedule, iteration: int, worker: StageWorker, attempts: Attempts,
                 queue: OperationQueue, awaited: AwaitedBackwards, in_use: dict[int, Route], owes: set[int],
                 result: IterationResult, gone: Callable[[], set[str]], broken: Broken | None = None,
                 give_up: GiveUp | None = None) -> None:
        """:param gone: the peers this peer goes around now (re-queued routes avoid them too)
        :param broken: told of each attempt that cannot finish here, to report it
        :param give_up: told of each microbatch of this holder's it cannot re-queue"""
        self.me, self.schedule, self.iteration, self.worker = me, schedule, iteration, worker
        self.attempts, self.queue, self.awaited, self.in_use, self.owes = attempts, queue, awaited, in_use, owes
        self.result, self.gone, self.on_broken, self.on_give_up = result, gone, broken, give_up
        self.routes = {r.microbatch: r for r in schedule.routes}
        self.disproved: set[str] = set()
        """Relays whose report against another peer this holder found false (`check_accusation`): gone around,
        like gone peers, for the rest of the iteration (the peer's runner keeps them for the epoch)."""

    def break_attempt(self, microbatch: int, gone: str, why: str, *, maybe_ran: bool = False) -> None:
        """The current attempt of `microbatch` cannot finish because of `gone`: its holder re-queues it (this peer,
        or the one the report goes to). Here that attempt is over: its stash is dropped, and a backward of it that
        still comes (`gone` was slow, not dead) is stale, so the stages before `gone` never count it."""
        attempt = self.attempts.current(microbatch)
        if not self.attempts.end(microbatch, attempt):
            return
        self.awaited.forget(microbatch)
        mine = self.routes[microbatch].origin == self.me
        if not mine:
            self.worker.drop(microbatch)
        self.result.broken += 1
        logger.warning("iteration %d: microbatch %d (attempt %d) cannot finish: %s", self.iteration, microbatch,
                       attempt, why, extra=event("microbatch_broken", microbatch=microbatch, attempt=attempt, why=why))
        report = Requeue(iteration=self.iteration, epoch=self.schedule.epoch, microbatch=microbatch, attempt=attempt,
                         gone=gone, why=why, maybe_ran=maybe_ran)
        if mine:
            self.requeue(report)
        if self.on_broken is not None:  # a holder's own word counts against `gone` too, and ends the attempt
            self.on_broken(report)       # at the relays that keep some of it

    def requeue(self, report: Requeue) -> None:
        """Run a microbatch of this holder's again, around the peer that broke its current attempt.

        Its gradient is in no stage's sum unless its loss was computed: then the stages after the gone peer on
        its path hold it (the backward passed them; the gone peer's own too if it may have run it), and so does
        the head; the new attempt tells them so. A report of an earlier attempt, of a microbatch not injected yet
        or already finished, is ignored; one of another holder's microbatch ends that attempt here.
        """
        mb = report.microbatch
        if self.routes.get(mb) is not None and self.routes[mb].origin != self.me:
            self._broken_elsewhere(report)
            return
        if mb not in self.owes or self.routes.get(mb) is None or \
                not self.attempts.is_current(mb, report.attempt) or self.queue.injecting(mb):
            return
        new, counted = None, frozenset()
        for avoid in peers_to_avoid(report, self.me, self.in_use[mb].nodes[1:]):
            new, counted = requeued_route(self.schedule, self.in_use[mb], report, self.attempts.counted(mb),
                                          loss_done=self.attempts.head_counted(mb), gone=self.gone() | avoid)
            if new is not None:
                break
        if new is None or report.attempt + 1 > MAX_MICROBATCH_ATTEMPTS:
            why = "no detour obeys the rules" if new is None else f"{MAX_MICROBATCH_ATTEMPTS} attempts broke"
            logger.warning("iteration %d: microbatch %d cannot be re-queued (%s): the iteration must run again",
                           self.iteration, mb, why)
            if self.on_give_up is not None:
                self.on_give_up(mb, f"{report.why}; {why}")
            return
        tested = report.reporter is not None and report.gone in new.nodes  # the accused is still on the path:
        self.attempts.begin(mb, report.attempt + 1, counted,  # the new attempt tests the word
                            accused=(report.reporter, report.gone) if tested else None)
        self.worker.drop(mb)
        self.awaited.forget(mb)
        self.in_use[mb] = new
        self.queue.inject_now(new)
        self.result.requeued.append((mb, report.attempt + 1))
        logger.warning("iteration %d: microbatch %d re-queued (attempt %d) on %s; stages %s already hold its "
                       "gradient", self.iteration, mb, report.attempt + 1, "/".join(new.nodes[1:]) or "stage 0",
                       sorted(counted) or "none")

    def check_accusation(self, r: Route) -> None:
        """This holder's microbatch reached its loss: if its attempt went through a peer another one had reported
        it broken at, that peer served it, and the report was false (or the reporter cannot reach it): reported
        against the reporter, whose microbatches went around it meanwhile."""
        disproved = self.attempts.disproved_by(r)
        if disproved is None or self.on_broken is None:
            return
        reporter, peer, attempt = disproved
        self.disproved.add(reporter)  # its other microbatches here go around it from now on
        why = f"it reported microbatch {r.microbatch} broken at {peer}, which then served its next attempt"
        logger.warning("iteration %d: %s", self.iteration, f"{reporter}: {why}",
                       extra=event("report_disproved", reporter=reporter, accused=peer, microbatch=r.microbatch))
        self.on_broken(Requeue(iteration=self.iteration, epoch=self.schedule.epoch, microbatch=r.microbatch,
                               attempt=attempt - 1, gone=reporter, why=why))

    def _broken_elsewhere(self, report: Requeue) -> None:
        """Another holder's microbatch attempt broke further along its path (reported by the peer that found it):
        its holder re-queues it, so what this relay keeps of that attempt is stale. Its stashed activations are
        dropped (they would hold a memory slot until the commit, and other microbatches' forwards wait for
        slots) and its backward is no longer awaited (it would not come, and this peer would blame its next hop)."""
        mb, attempt = report.microbatch, report.attempt
        if not self.attempts.is_current(mb, attempt) or not self.attempts.end(mb, attempt):
            return
        self.awaited.forget(mb)
        if self.worker.drop(mb):
            logger.info("microbatch %d's attempt %d broke at %s: its stashed forward is dropped here", mb, attempt,
                        report.gone)
