"""`PipelineExecutor`: one peer's part of one iteration, driven by the messages it receives.

The networked counterpart of `peers.inprocess.InProcessSwarm`'s loop, calling the same `StageWorker`
methods. A data holder injects its microbatches (at their planned times, while it has memory slots),
computes their loss when they come back and ends their backward; every peer forwards and backpropagates
what its stage is sent. It runs one operation at a time and chooses the next as the planner's simulator does
(`scheduler.simulator`, `backward_first`): waiting backward passes and losses first (they free memory), then
forwards and due injections by arrival, a relay's forward before an injection due at the same time; a forward
the worker cannot admit (TC1) waits until a backward frees a slot. Messages that arrive during an operation
are considered before the next one, so the measured iteration follows the plan the simulator scored.

Nothing from the network is trusted: a message must match the schedule (its microbatch's route and
stages, or a detour of them; the epoch; the sender being the previous hop), and the worker checks the tensor
itself. Anything else is logged with the sender's peer id and dropped; the iteration goes on.

Peers that are gone (the scheduler said so, or no stream to them could be opened) are detoured around in flight:
a forward goes to another peer of the same stage, or of another stage the path may take instead
(`scheduler.detour`). A microbatch whose activations a gone peer held cannot finish its backward pass: it is
reported broken to its data holder, which re-queues it at once on its route around the gone peer (a new
`attempt`; messages of earlier ones are stale). Stages whose gradient already holds it (those its backward had
passed, when its loss had been computed) run it again without accumulating (`HopHeader.counted`), so every stage
counts it at most once and the rest of the iteration goes on. A holder that cannot re-queue it (no detour obeys
the rules, or `MAX_MICROBATCH_ATTEMPTS` reached) asks the scheduler to run the iteration again. A peer that died
holding a microbatch in its queue causes no failed send: the peer that sent it the forward notices when the
backward is late past its per-hop deadline (the plan's round trip, scaled to measured times) and checks on it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from peers.worker import StageWorker, WorkerError
from scheduler.detour import detour
from scheduler.schedule import Route, Schedule
from swarm.constants import MAX_MICROBATCH_ATTEMPTS
from swarm.events import event
from swarm.net.delivery import Inbound, Send, Undelivered
from swarm.peer.awaited_backwards import AwaitedBackwards
from swarm.peer.hop_check import hop_mismatch
from swarm.peer.timeline import Timeline
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Requeue:
    """A peer's report, for the data holder that injected `microbatch`: its `attempt` cannot finish because `gone`
    (a peer on its path) is gone."""

    iteration: int
    epoch: int
    microbatch: int
    attempt: int
    gone: str
    why: str = ""
    maybe_ran: bool = False
    """Whether `gone` may have run this attempt's backward (a send to it failed after it may have arrived): then
    its stage is taken to hold the microbatch already, lest a wrongly suspected peer's stage count it twice."""
    reporter: str | None = None
    """The peer whose report this is (None: this peer found it)."""


Receive = Callable[[float], "list[Inbound | Undelivered | Requeue]"]
"""receive(timeout): this iteration's messages that arrived, waiting up to `timeout` for the first."""
Broken = Callable[[Requeue], None]
"""broken(report): an attempt of a microbatch of this iteration cannot finish (its activations died with a peer);
the report is for its data holder."""
GiveUp = Callable[[int, str], None]
"""give_up(microbatch, why): this holder cannot re-queue its microbatch: the iteration must be run again."""


class IterationTimeout(RuntimeError):
    """The iteration did not complete before its deadline (a peer or link failed)."""


class IterationAborted(RuntimeError):
    """The scheduler replaced this iteration's schedule (a peer died or joined): abandon it and run it again."""


@dataclass
class IterationResult:
    """What this peer did in one iteration."""

    iteration: int
    loss_sum: float = 0.0
    losses: int = 0
    """Microbatches whose loss this peer computed (data holders)."""
    loss_of: dict[int, float] = field(default_factory=dict)
    """Each of those microbatches' loss."""
    tokens: int = 0
    backward_done: int = 0
    started: float = field(default_factory=time.time)
    finished: float = 0.0
    dropped: int = 0
    """Messages refused (not matching the schedule, or refused by the worker)."""
    detours: int = 0
    """Forwards this peer sent around a gone peer."""
    broken: int = 0
    """Microbatch attempts this peer found unable to finish (reported to their data holder)."""
    requeued: list[tuple[int, int]] = field(default_factory=list)
    """(microbatch, attempt) of each microbatch of this holder's run again after a peer on its path died."""
    stale: int = 0
    """Messages of a re-queued microbatch's earlier attempt, dropped."""


def expected_backwards(schedule: Schedule, peer: str) -> int:
    """Backward passes `peer` runs per iteration: one per route through it, one per route it originates."""
    return sum(r.peers.count(peer) + (r.origin == peer) for r in schedule.routes)


def requeued_route(schedule: Schedule, r: Route, report: Requeue, counted: frozenset[int], *, loss_done: bool,
                   gone: set[str]) -> tuple[Route | None, frozenset[int]]:
    """The route a re-queued microbatch takes around `gone` peers (None if no detour obeys the rules), and the
    stages whose gradient holds it already: those its backward passed after the loss, from the peer that broke it
    on (from that peer's stage too if it `maybe_ran` the backward); every stage if where it stopped is unknown."""
    counted = set(counted)
    if loss_done and report.gone in r.nodes[1:]:
        hop = r.nodes.index(report.gone)
        counted |= set(r.stages[hop - 1 if report.maybe_ran else hop:])
    elif loss_done:
        counted |= set(r.stages)
    new: Route | None = r
    for hop in range(1, len(r.nodes)):
        if new is not None and new.nodes[hop] in gone:
            new = detour(schedule, new, hop, gone)
    return new, frozenset(counted)


class PipelineExecutor:
    """Runs one iteration of `schedule` on this peer's `worker`. Admission of a message is the pure
    `hop_mismatch`; the forwards whose backward it waits for are its `AwaitedBackwards`.

    At ~420 lines it is past the size a class should have: the ordering of operations (`_step`) and the
    bookkeeping of broken attempts (`_break`, `requeue`, `_avoid`, `_check_accusation`, the attempt and counted
    maps) share the attempt state. The next move takes the attempt bookkeeping out into a class of its own that
    this one asks whether a message is stale and tells of breaks.
    """

    def __init__(self, *, me: str, worker: StageWorker, schedule: Schedule, run_id: str, iteration: int,
                 send: Send, batches: dict[int, torch.Tensor] | None = None,
                 hold: Callable[[Inbound], None] | None = None, timeline: Timeline | None = None,
                 gone: Callable[[], Collection[str]] = frozenset, broken: Broken | None = None,
                 give_up: GiveUp | None = None, awaited: AwaitedBackwards | None = None) -> None:
        """:param hold: takes messages of a newer schedule epoch (from peers that switched first) for later
        :param timeline: records each operation's span (forward, backward, ...)
        :param gone: peers known to be gone (declared by the scheduler, or unreachable from this peer); read
          often, detoured around
        :param broken: told of each microbatch attempt that cannot finish here, to report it (this holder's own
          it also re-queues; another holder's, its holder re-queues on the report)
        :param give_up: told of each microbatch of this holder's it cannot re-queue
        :param awaited: the forwards' deadlines (`AwaitedBackwards`; none by default): a dead next hop holding a
          microbatch is otherwise noticed only when its record expires, and a live one holding it past its stall
          limit breaks that attempt (reported like a dead one's: its holder re-queues it around that peer)"""
        self.me, self.worker, self.schedule, self.run_id, self.iteration = me, worker, schedule, run_id, iteration
        self.timeline = timeline
        self.send = send
        self.hold = hold
        self.routes = {r.microbatch: r for r in schedule.routes}
        self.in_use: dict[int, Route] = dict(self.routes)
        """Each microbatch's route as this peer last saw it: the scheduled one, or a detour of it."""
        self.gone, self.on_broken, self.on_give_up = gone, broken, give_up
        self.awaited = awaited if awaited is not None else AwaitedBackwards()
        self.unreachable: set[str] = set()
        """Peers no stream could be opened to during this iteration."""
        self.disproved: set[str] = set()
        """Relays whose report against another peer this holder found false (`_check_accusation`): gone around,
        like gone peers, for the rest of the iteration (the peer's runner keeps them for the epoch)."""
        self._broken: set[tuple[int, int]] = set()
        self._attempt: dict[int, int] = {}
        """Microbatch -> its newest attempt this peer has seen (0 unless re-queued)."""
        self._counted: dict[int, frozenset[int]] = {}
        """Microbatch -> the stages whose gradient already holds it (sent along by its holder)."""
        self._head_counted: set[int] = set()
        """This holder's microbatches whose loss (and head gradient) is already in the sums."""
        self._accused: dict[int, tuple[str, str, int]] = {}
        """This holder's microbatch -> (reporter, the peer it reported the attempt broken at, the new attempt that
        still goes through that peer): see `_check_accusation`."""
        self.own = sorted((r for r in schedule.routes if r.origin == me), key=lambda r: (r.inject_after, r.microbatch))
        self._owes: set[int] = {r.microbatch for r in schedule.routes if me in r.peers or r.origin == me}
        """Microbatches whose backward this peer is still to run, each counted once in `expected`."""
        self.batches = batches or {}
        missing = [r.microbatch for r in self.own if r.microbatch not in self.batches]
        if missing:
            raise ValueError(f"no tokens for this holder's microbatches {missing}")
        self.expected = expected_backwards(schedule, me)
        self.result = IterationResult(iteration=iteration)
        self._ready: list[tuple[tuple[int, float, int, int], Inbound]] = []
        """Accepted messages waiting for their operation, each with the key that orders it (see `_step`)."""
        self._arrivals = itertools.count()
        self._pending: list[Route] = list(self.own)
        """This holder's microbatches not injected yet."""
        self._start = time.monotonic()
        self._poll: Receive | None = None

    def run(self, receive: Receive, *, deadline: float, aborted: Callable[[], bool] = lambda: False,
            settled: Callable[[], bool] = lambda: False) -> IterationResult:
        """Process until every backward this peer expects has run, or the iteration is settled.

        :param aborted: polled between operations; True abandons the iteration (IterationAborted)
        :param settled: polled between operations; True once the iteration is committed (every holder's
          microbatches finished): a relay still expecting the backward of a microbatch re-queued around it stops
        :raises IterationTimeout: past `deadline` seconds
        """
        self._poll = receive
        self._start = time.monotonic()
        while not self.done and not settled():
            if aborted():
                raise IterationAborted(f"iteration {self.iteration} abandoned for a newer schedule")
            if time.monotonic() - self._start > deadline:
                waiting = sum(key[0] for key, _ in self._ready)
                raise IterationTimeout(
                    f"iteration {self.iteration}: {self.result.backward_done}/{self.expected} backward passes after "
                    f"{deadline:.0f} s (stashed {self.worker.stashed}, {waiting} forwards waiting)")
            self._accept(receive(0.0))
            self._check_late()
            if not self._step():
                self._accept(receive(self._idle_wait()))
        self.result.finished = time.time()
        return self.result

    @property
    def done(self) -> bool:
        return self.result.backward_done >= self.expected

    def handle(self, messages: list[Inbound | Undelivered | Requeue]) -> None:
        """Process messages of this iteration; also after `run` returned, while the peer waits for the commit:
        a detour may still bring it a microbatch of a gone peer of its stage."""
        self._accept(messages)
        self._check_late()
        while self._step():
            if self._poll is not None:
                self._accept(self._poll(0.0))

    def _accept(self, messages: list[Inbound | Undelivered | Requeue]) -> None:
        """Queue arrived messages for their operation (a newer epoch's are held for later); act on undelivered
        sends and re-queue reports at once (they cost no compute)."""
        for m in messages:
            if isinstance(m, Undelivered):
                self._undelivered(m)
            elif isinstance(m, Requeue):
                if m.iteration == self.iteration and m.epoch == self.schedule.epoch:
                    self.requeue(m)
            elif m.header.epoch > self.schedule.epoch and self.hold is not None:
                self.hold(m)
            else:
                h = m.header
                if h.direction == Direction.BACKWARD and h.attempt == self._attempt.get(h.microbatch, 0):
                    self.awaited.returned(h.microbatch, m.sender, h.attempt)
                first = h.direction == Direction.BACKWARD or (h.direction == Direction.FORWARD and h.hop == 0)
                self._ready.append(((0 if first else 1, time.monotonic(), 0, next(self._arrivals)), m))
        self._check_awaited()

    def _step(self) -> bool:
        """Run the next operation, chosen as the simulator chooses; False when none can run now.

        Keys: (0 for a backward or loss, 1 for a forward; arrival; 1 for an injection; arrival order). Forwards
        and injections wait while every memory slot holds activations."""
        room = len(self.worker.stashed) < self.worker.memory_slots
        best: tuple[tuple[int, float, int, int], int] | None = None
        for i, (key, m) in enumerate(self._ready):
            if (key[0] == 0 or room or self._supersedes(m)) and (best is None or key < best[0]):
                best = (key, i)
        if room and self._pending:
            due = self._start + self._pending[0].inject_after
            if due <= time.monotonic() and (best is None or (1, due, 1, -1) < best[0]):
                self._inject(self._pending.pop(0))
                return True
        if best is None:
            return False
        self._handle(self._ready.pop(best[1])[1])
        return True

    def _supersedes(self, m: Inbound) -> bool:
        """A re-queued microbatch's forward: it frees the memory slot its stashed earlier attempt holds."""
        h = m.header
        return h.attempt > self._attempt.get(h.microbatch, 0) and h.microbatch in self.worker.stashed

    def _idle_wait(self) -> float:
        """Seconds to wait for a message when nothing can run: until the next injection is due, at most 0.2."""
        if self._pending and len(self.worker.stashed) < self.worker.memory_slots:
            return max(0.0, min(0.2, self._start + self._pending[0].inject_after - time.monotonic()))
        return 0.2

    # ---- steps of a microbatch --------------------------------------------------------------------
    def _inject(self, r: Route) -> None:
        tokens = self.batches[r.microbatch]
        start = time.time()
        act = self.worker.inject(r.microbatch, tokens)
        self._span("inject", start, r.microbatch, 0)
        if not self._attempt.get(r.microbatch):  # a re-queued microbatch's tokens are counted once
            self.result.tokens += tokens.shape[0] * (tokens.shape[1] - 1)
        if not r.peers:  # R = 1: the path is stage 0 alone
            self._loss(r, act)
            return
        self._emit(r, 1, Direction.FORWARD, act)

    def _span(self, kind: str, start: float, microbatch: int, stage: int | None) -> None:
        if self.timeline is not None:
            self.timeline.record(kind, start, time.time(), microbatch=microbatch, stage=stage,
                                 iteration=self.iteration)

    def _loss(self, r: Route, act: torch.Tensor) -> None:
        self._check_accusation(r)
        counted = r.microbatch in self._head_counted  # its loss was computed before the path broke
        start = time.time()
        loss, grad = self.worker.loss(r.microbatch, act, accumulate=not counted)
        self._span("loss", start, r.microbatch, 0)
        if not counted:
            self._head_counted.add(r.microbatch)
            self.result.loss_sum += loss
            self.result.losses += 1
            self.result.loss_of[r.microbatch] = loss
        if r.peers:
            self._emit(r, len(r.peers), Direction.BACKWARD, grad)
        else:
            start = time.time()
            self.worker.backward(r.microbatch, grad)
            self._span("backward", start, r.microbatch, 0)
            self.result.backward_done += 1
            self._owes.discard(r.microbatch)

    def _emit(self, r: Route, hop: int, direction: Direction, tensor: torch.Tensor) -> None:
        if direction == Direction.FORWARD and hop > 0:
            detoured = self._around_gone(r, hop)
            if detoured is None:
                return
            r, hop = detoured
        header = HopHeader(run=self.run_id, iteration=self.iteration, microbatch=r.microbatch, route=r.nodes, hop=hop,
                           direction=direction, epoch=self.schedule.epoch, dtype="", shape=(),
                           stages=(0, *r.stages), attempt=self._attempt.get(r.microbatch, 0),
                           counted=tuple(sorted(self._counted.get(r.microbatch, ()))))
        sent = self.send(r.nodes[hop], header, tensor)
        if direction == Direction.FORWARD:
            self.awaited.sent(r.microbatch, r.nodes[hop], sent, self._attempt.get(r.microbatch, 0))

    def _gone_now(self) -> set[str]:
        return set(self.gone()) | self.unreachable | self.disproved

    def _around_gone(self, r: Route, hop: int) -> tuple[Route, int] | None:
        """The route and hop a forward takes from here: `r` itself, or a detour around gone peers."""
        gone = self._gone_now()
        while hop > 0 and r.nodes[hop] in gone:
            amended = detour(self.schedule, r, hop, gone)
            if amended is None:
                self._break(r.microbatch, r.nodes[hop], f"{r.nodes[hop]} (stage {r.stages[hop - 1]}) is gone and no "
                                                        f"detour obeys the rules")
                return None
            logger.warning("microbatch %d: %s (stage %d) is gone; forward detoured to %s (stage %d)", r.microbatch,
                           r.nodes[hop], r.stages[hop - 1], amended.nodes[hop], amended.stages[hop - 1],
                           extra=event("detoured", microbatch=r.microbatch, gone=r.nodes[hop], to=amended.nodes[hop],
                                       to_stage=amended.stages[hop - 1]))
            self.result.detours += 1
            r = amended
        self.in_use[r.microbatch] = r
        return r, hop

    def _undelivered(self, u: Undelivered) -> None:
        h = u.header
        r = self.in_use.get(h.microbatch)
        if h.run != self.run_id or h.iteration != self.iteration or h.epoch != self.schedule.epoch or r is None or \
                h.attempt != self._attempt.get(h.microbatch, 0):
            return
        if h.direction == Direction.FORWARD and h.hop > 0 and u.unreachable and tuple(h.route) == r.nodes:
            self.unreachable.add(u.peer)
            self.awaited.forget(h.microbatch)
            self._emit(r, h.hop, Direction.FORWARD, u.tensor)  # detours around it
        else:  # a refusal or a timeout: the peer may have received it
            self._break(h.microbatch, u.peer, f"its {h.direction.name.lower()} could not be delivered to {u.peer}",
                        maybe_ran=not u.unreachable)

    def _check_late(self) -> None:
        """Backwards late past their hop deadline make this peer check on the next hop (`overdue`); one still not
        back past its stall limit breaks its attempt there: that peer answers, but holds the iteration up."""
        self.awaited.check_overdue(self._broken, self.iteration)
        for mb, peer, attempt, waited in self.awaited.stalled(self._broken):
            if attempt == self._attempt.get(mb, 0):
                limit = self.awaited.stall_limits[mb]
                self._break(mb, peer, f"{peer} has held it for {waited:.1f} s (stall limit {limit:.1f} s)",
                            maybe_ran=True)

    def _check_awaited(self) -> None:
        """A microbatch whose forward went to a peer now gone cannot come back: that peer held its activations."""
        gone = self._gone_now()
        for mb, peer, attempt in self.awaited.lost_to(gone) if gone else ():
            if attempt == self._attempt.get(mb, 0) and (mb, attempt) not in self._broken:
                self._break(mb, peer, f"its activations were with {peer}, which is gone")

    def _break(self, microbatch: int, gone: str, why: str, *, maybe_ran: bool = False) -> None:
        """The current attempt of `microbatch` cannot finish because of `gone`: its holder re-queues it (this peer,
        or the one the report goes to). Here that attempt is over: its stash is dropped, and a backward of it that
        still comes (`gone` was slow, not dead) is stale, so the stages before `gone` never count it."""
        attempt = self._attempt.get(microbatch, 0)
        if (microbatch, attempt) in self._broken:
            return
        self._broken.add((microbatch, attempt))
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
        or already finished, is ignored; one of another holder's microbatch ends that attempt here
        (`_attempt_broken_elsewhere`).
        """
        mb = report.microbatch
        if self.routes.get(mb) is not None and self.routes[mb].origin != self.me:
            self._attempt_broken_elsewhere(report)
            return
        if mb not in self._owes or self.routes.get(mb) is None or \
                report.attempt != self._attempt.get(mb, 0) or any(p.microbatch == mb for p in self._pending):
            return
        new, counted = None, frozenset()
        for avoid in self._avoid(report):
            new, counted = requeued_route(self.schedule, self.in_use[mb], report, self._counted.get(mb, frozenset()),
                                          loss_done=mb in self._head_counted, gone=self._gone_now() | avoid)
            if new is not None:
                break
        if new is None or report.attempt + 1 > MAX_MICROBATCH_ATTEMPTS:
            why = "no detour obeys the rules" if new is None else f"{MAX_MICROBATCH_ATTEMPTS} attempts broke"
            logger.warning("iteration %d: microbatch %d cannot be re-queued (%s): the iteration must run again",
                           self.iteration, mb, why)
            if self.on_give_up is not None:
                self.on_give_up(mb, f"{report.why}; {why}")
            return
        self._attempt[mb] = report.attempt + 1
        self._counted[mb] = counted
        self.worker.drop(mb)
        self.awaited.forget(mb)
        self.in_use[mb] = new
        if report.reporter is not None and report.gone in new.nodes:  # the accused is still on the path:
            self._accused[mb] = (report.reporter, report.gone, report.attempt + 1)  # the new attempt tests the word
        self._pending.insert(0, dataclasses.replace(new, inject_after=0.0))
        self.result.requeued.append((mb, report.attempt + 1))
        logger.warning("iteration %d: microbatch %d re-queued (attempt %d) on %s; stages %s already hold its "
                       "gradient", self.iteration, mb, report.attempt + 1, "/".join(new.nodes[1:]) or "stage 0",
                       sorted(counted) or "none")

    def _avoid(self, report: Requeue) -> list[set[str]]:
        """The peers a re-queued microbatch goes around, in order of preference: the peer it broke at; else, when
        a relay on its path reported that and nothing can take that peer's place, the reporter. Its word may be a
        lie (a relay sitting on microbatches can blame the peer after it, alone on its stage, and the iteration
        would run again and again); going around the reporter instead tests it (`_check_accusation`)."""
        reporter, on_path = report.reporter, self.in_use[report.microbatch].nodes[1:]
        if reporter is None or reporter == self.me or reporter not in on_path or reporter == report.gone:
            return [{report.gone}]
        return [{report.gone}, {reporter}]

    def _check_accusation(self, r: Route) -> None:
        """This holder's microbatch reached its loss: if its attempt went through a peer another one had reported
        it broken at, that peer served it, and the report was false (or the reporter cannot reach it): reported
        against the reporter, whose microbatches went around it meanwhile."""
        accused = self._accused.get(r.microbatch)
        if accused is None or accused[2] != self._attempt.get(r.microbatch, 0):
            return
        reporter, peer, attempt = self._accused.pop(r.microbatch)
        if peer not in r.nodes or self.on_broken is None:
            return
        self.disproved.add(reporter)  # its other microbatches here go around it from now on
        why = f"it reported microbatch {r.microbatch} broken at {peer}, which then served its next attempt"
        logger.warning("iteration %d: %s", self.iteration, f"{reporter}: {why}",
                       extra=event("report_disproved", reporter=reporter, accused=peer, microbatch=r.microbatch))
        self.on_broken(Requeue(iteration=self.iteration, epoch=self.schedule.epoch, microbatch=r.microbatch,
                               attempt=attempt - 1, gone=reporter, why=why))

    def _attempt_broken_elsewhere(self, report: Requeue) -> None:
        """Another holder's microbatch attempt broke further along its path (reported by the peer that found it):
        its holder re-queues it, so what this relay keeps of that attempt is stale. Its stashed activations are
        dropped (they would hold a memory slot until the commit, and other microbatches' forwards wait for
        slots) and its backward is no longer awaited (it would not come, and this peer would blame its next hop)."""
        mb, attempt = report.microbatch, report.attempt
        if attempt != self._attempt.get(mb, 0) or (mb, attempt) in self._broken:
            return
        self._broken.add((mb, attempt))
        self.awaited.forget(mb)
        if self.worker.drop(mb):
            logger.info("microbatch %d's attempt %d broke at %s: its stashed forward is dropped here", mb, attempt,
                        report.gone)

    def _handle(self, m: Inbound) -> None:
        h = m.header
        attempt = self._attempt.get(h.microbatch, 0)
        scheduled = self.routes.get(h.microbatch)
        mine = scheduled is not None and scheduled.origin == self.me  # only its holder starts a new attempt
        if (h.attempt < attempt or (mine and h.attempt != attempt) or (h.microbatch, h.attempt) in self._broken) \
                and h.run == self.run_id and h.iteration == self.iteration:
            self.result.stale += 1
            logger.info("%s of microbatch %d's attempt %d from %s dropped: a stale attempt (this peer is at %d)",
                        h.direction.name.lower(), h.microbatch, h.attempt, m.sender, attempt)
            return
        why = hop_mismatch(m, schedule=self.schedule, routes=self.routes, in_use=self.in_use, run_id=self.run_id,
                           iteration=self.iteration, me=self.me)
        if why:
            self.result.dropped += 1
            logger.warning("dropped %s of microbatch %d from %s: %s", h.direction.name.lower(), h.microbatch,
                           m.sender, why, extra=event("dropped_message", sender=m.sender, microbatch=h.microbatch,
                                                      why=why))
            return
        if h.attempt > attempt:  # a re-queued microbatch: what this peer holds of an earlier attempt is stale
            self._attempt[h.microbatch] = h.attempt
            self.awaited.forget(h.microbatch)
            if self.worker.drop(h.microbatch):
                logger.info("microbatch %d's attempt %d arrived: the stashed earlier attempt is dropped",
                            h.microbatch, h.attempt)
        if h.direction == Direction.FORWARD and h.hop > 0:
            self._counted[h.microbatch] = frozenset(h.counted)
        r = self.in_use[h.microbatch]
        if tuple(h.route) != r.nodes:
            r = self.in_use[h.microbatch] = Route(microbatch=r.microbatch, origin=r.origin, stages=tuple(h.stages[1:]),
                                                  peers=tuple(h.route[1:]), inject_after=r.inject_after)
        if h.direction == Direction.FORWARD and h.hop > 0 and h.microbatch not in self._owes:
            self._owes.add(h.microbatch)  # a detour made this peer stand in for a gone one, or a re-queue came back
            self.expected += 1
        if h.direction == Direction.BACKWARD:
            self.awaited.forget(h.microbatch)
        try:
            if h.direction == Direction.FORWARD and h.hop == 0:
                self._loss(r, m.tensor)
            elif h.direction == Direction.FORWARD:
                start = time.time()  # `_step` admits a forward only while a memory slot is free
                act = self.worker.forward(h.microbatch, m.tensor, stage=r.stages[h.hop - 1])
                self._span("forward", start, h.microbatch, r.stages[h.hop - 1])
                nxt = h.hop + 1 if h.hop < len(r.peers) else 0
                self._emit(r, nxt, Direction.FORWARD, act)
            else:
                stage = r.stages[h.hop - 1] if h.hop > 0 else None
                accumulate = stage not in self._counted.get(h.microbatch, ())
                start = time.time()
                grad = self.worker.backward(h.microbatch, m.tensor, stage=stage, accumulate=accumulate)
                self._span("backward", start, h.microbatch, 0 if stage is None else stage)
                self.result.backward_done += 1
                self._owes.discard(h.microbatch)
                if h.hop > 0:
                    self._emit(r, h.hop - 1, Direction.BACKWARD, grad)
        except WorkerError as e:
            self.result.dropped += 1
            logger.warning("worker refused %s of microbatch %d from %s: %s", h.direction.name.lower(), h.microbatch,
                           m.sender, e, extra=event("dropped_message", sender=m.sender, microbatch=h.microbatch,
                                                    why=f"worker: {e}"))
