"""`PipelineExecutor`: one peer's part of one iteration, driven by the messages it receives.

The networked counterpart of `peers.inprocess.InProcessSwarm`'s loop, calling the same `StageWorker`
methods. A data holder injects its microbatches (at their planned times, while it has memory slots),
computes their loss when they come back and ends their backward; every peer forwards and backpropagates
what its stage is sent. It runs one operation at a time and chooses the next as the planner's simulator does
(`OperationQueue`, after `scheduler.simulator`'s `backward_first`): waiting backward passes and losses first
(they free memory), then forwards and due injections by arrival, a relay's forward before an injection due at the
same time; a forward the worker cannot admit (TC1) waits until a backward frees a slot. Messages that arrive
during an operation are considered before the next one, so the measured iteration follows the plan the simulator
scored.

Nothing from the network is trusted: a message must match the schedule (its microbatch's route and
stages, or a detour of them; the epoch; the sender being the previous hop), and the worker checks the tensor
itself. Anything else is logged with the sender's peer id and dropped; the iteration goes on.

Peers that are gone (the scheduler said so, or no stream to them could be opened) are detoured around in flight: a
forward goes to another peer of the same stage, or of another stage the path may take instead (`scheduler.detour`).
A microbatch whose activations a gone peer held cannot finish its backward pass: it is reported broken to its data
holder (`AttemptRecovery`), which re-queues it at once on its route around the gone peer (a new `attempt`; messages
of earlier ones are stale). Stages whose gradient already holds it (those its backward had passed, when its loss had
been computed) run it again without accumulating (`HopHeader.counted`), so every stage counts it at most once and
the rest of the iteration goes on. A holder that cannot re-queue it (no detour obeys the rules, or
`MAX_MICROBATCH_ATTEMPTS` reached) asks the scheduler to run the iteration again. A peer that died holding a
microbatch in its queue causes no failed send: the peer that sent it the forward notices when the backward is late
past its per-hop deadline (the plan's round trip, scaled to measured times) and checks on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

import torch

from peers.worker import StageWorker, WorkerError
from scheduler.detour import detour
from scheduler.schedule import Route, Schedule
from swarm.events import event
from swarm.net.delivery import Inbound, Send, Undelivered
from swarm.peer.attempt_recovery import AttemptRecovery, Broken, GiveUp
from swarm.peer.attempts import Attempts, Requeue
from swarm.peer.awaited_backwards import AwaitedBackwards
from swarm.peer.hop_check import hop_mismatch
from swarm.peer.iteration_result import IterationResult
from swarm.peer.operation_queue import OperationQueue
from swarm.peer.timeline import Timeline
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)


Receive = Callable[[float], "list[Inbound | Undelivered | Requeue]"]
"""receive(timeout): this iteration's messages that arrived, waiting up to `timeout` for the first."""


class IterationTimeout(RuntimeError):
    """The iteration did not complete before its deadline (a peer or link failed)."""


class IterationAborted(RuntimeError):
    """The scheduler replaced this iteration's schedule (a peer died or joined): abandon it and run it again."""


def expected_backwards(schedule: Schedule, peer: str) -> int:
    """Backward passes `peer` runs per iteration: one per route through it, one per route it originates."""
    return sum(r.peers.count(peer) + (r.origin == peer) for r in schedule.routes)


class PipelineExecutor:
    """Runs one iteration of `schedule` on this peer's `worker`. Admission of a message is the pure
    `hop_mismatch`; what runs next is its `OperationQueue`'s choice; the forwards whose backward it waits for are
    its `AwaitedBackwards`; which attempt of each microbatch is current, and what each carries, its `Attempts`."""

    def __init__(self, *, me: str, worker: StageWorker, schedule: Schedule, run_id: str, iteration: int,
                 send: Send, batches: dict[int, torch.Tensor] | None = None,
                 hold: Callable[[Inbound], None] | None = None, timeline: Timeline | None = None,
                 gone: Callable[[], Collection[str]] = frozenset, broken: Broken | None = None,
                 give_up: GiveUp | None = None, awaited: AwaitedBackwards | None = None,
                 left_out: Callable[[], Collection[str]] = frozenset) -> None:
        """:param hold: takes messages of a newer schedule epoch (from peers that switched first) for later
        :param timeline: records each operation's span (forward, backward, ...)
        :param gone: peers known to be gone (declared by the scheduler, or unreachable from this peer); read
          often, detoured around
        :param broken: told of each microbatch attempt that cannot finish here, to report it (this holder's own
          it also re-queues; another holder's, its holder re-queues on the report)
        :param give_up: told of each microbatch of this holder's it cannot re-queue
        :param awaited: the forwards' deadlines (`AwaitedBackwards`; none by default): a dead next hop holding a
          microbatch is otherwise noticed only when its record expires, and a live one holding it past its stall
          limit breaks that attempt (reported like a dead one's: its holder re-queues it around that peer)
        :param left_out: data holders the scheduler declared gone, read often. The iteration commits without their
          microbatches (`Commit.left_out`; or it is run again), so this peer runs none of their work, frees the
          memory slots their forwards hold, and awaits none of their backwards"""
        self.me, self.worker, self.schedule, self.run_id, self.iteration = me, worker, schedule, run_id, iteration
        self.timeline = timeline
        self.send = send
        self.hold = hold
        self.routes = {r.microbatch: r for r in schedule.routes}
        self.in_use: dict[int, Route] = dict(self.routes)
        """Each microbatch's route as this peer last saw it: the scheduled one, or a detour of it."""
        self.gone, self.left_out = gone, left_out
        self.awaited = awaited if awaited is not None else AwaitedBackwards()
        self.unreachable: set[str] = set()
        """Peers no stream could be opened to during this iteration."""
        self.attempts = Attempts()
        self.own = sorted((r for r in schedule.routes if r.origin == me), key=lambda r: (r.inject_after, r.microbatch))
        self._owes: set[int] = {r.microbatch for r in schedule.routes if me in r.peers or r.origin == me}
        """Microbatches whose backward this peer is still to run, each counted once in `expected`."""
        self.batches = batches or {}
        missing = [r.microbatch for r in self.own if r.microbatch not in self.batches]
        if missing:
            raise ValueError(f"no tokens for this holder's microbatches {missing}")
        self.expected = expected_backwards(schedule, me)
        self.result = IterationResult(iteration=iteration)
        self.queue = OperationQueue(self.own)
        self.recovery = AttemptRecovery(me=me, schedule=schedule, iteration=iteration, worker=worker,
                                        attempts=self.attempts, queue=self.queue, awaited=self.awaited,
                                        in_use=self.in_use, owes=self._owes, result=self.result, gone=self._gone_now,
                                        broken=broken, give_up=give_up)
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
        self.queue.restart()
        while not self.done and not settled():
            if aborted():
                raise IterationAborted(f"iteration {self.iteration} abandoned for a newer schedule")
            if time.monotonic() - self.queue.start > deadline:
                raise IterationTimeout(
                    f"iteration {self.iteration}: {self.result.backward_done}/{self.expected} backward passes after "
                    f"{deadline:.0f} s (stashed {self.worker.stashed}, {self.queue.forwards_waiting()} forwards "
                    f"waiting)")
            self._accept(receive(0.0))
            self._check_late()
            if not self._step():
                self._accept(receive(self.queue.idle_wait(self._room())))
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
        sends and re-queue reports at once (they cost no compute). A left-out holder's are dropped."""
        left_out = self._drop_left_out()
        for m in messages:
            if isinstance(m, Undelivered):
                self._undelivered(m)
            elif isinstance(m, Requeue):
                if m.iteration == self.iteration and m.epoch == self.schedule.epoch:
                    self.requeue(m)
            elif m.header.epoch > self.schedule.epoch and self.hold is not None:
                self.hold(m)
            elif self._holder(m.header.microbatch) in left_out:
                self.result.left_out += 1
            else:
                h = m.header
                if h.direction == Direction.BACKWARD and self.attempts.is_current(h.microbatch, h.attempt):
                    self.awaited.returned(h.microbatch, m.sender, h.attempt)
                self.queue.add(m)
        self._check_awaited()

    def _step(self) -> bool:
        """Run the operation the queue chooses next; False when none can run now."""
        op = self.queue.next(self._room(), self._supersedes)
        if op is None:
            return False
        if isinstance(op, Route):
            self._inject(op)
        else:
            self._handle(op)
        return True

    def _room(self) -> bool:
        """Whether a memory slot is free for a forward or an injection (TC1)."""
        return len(self.worker.stashed) < self.worker.memory_slots

    def _supersedes(self, m: Inbound) -> bool:
        """A re-queued microbatch's forward: it frees the memory slot its stashed earlier attempt holds."""
        h = m.header
        return h.attempt > self.attempts.current(h.microbatch) and h.microbatch in self.worker.stashed

    # ---- steps of a microbatch --------------------------------------------------------------------
    def _inject(self, r: Route) -> None:
        tokens = self.batches[r.microbatch]
        start = time.time()
        act = self.worker.inject(r.microbatch, tokens)
        self._span("inject", start, r.microbatch, 0)
        if not self.attempts.current(r.microbatch):  # a re-queued microbatch's tokens are counted once
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
        self.recovery.check_accusation(r)
        counted = self.attempts.head_counted(r.microbatch)  # its loss was computed before the path broke
        start = time.time()
        loss, grad = self.worker.loss(r.microbatch, act, accumulate=not counted)
        self._span("loss", start, r.microbatch, 0)
        if not counted:
            self.attempts.count_head(r.microbatch)
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
                           stages=(0, *r.stages), attempt=self.attempts.current(r.microbatch),
                           counted=tuple(sorted(self.attempts.counted(r.microbatch))))
        sent = self.send(r.nodes[hop], header, tensor)
        if direction == Direction.FORWARD:
            self.awaited.sent(r.microbatch, r.nodes[hop], sent, self.attempts.current(r.microbatch))

    def _gone_now(self) -> set[str]:
        return set(self.gone()) | self.unreachable | self.disproved

    def _around_gone(self, r: Route, hop: int) -> tuple[Route, int] | None:
        """The route and hop a forward takes from here: `r` itself, or a detour around gone peers."""
        gone = self._gone_now()
        while hop > 0 and r.nodes[hop] in gone:
            amended = detour(self.schedule, r, hop, gone)
            if amended is None:
                self.recovery.break_attempt(r.microbatch, r.nodes[hop], f"{r.nodes[hop]} (stage {r.stages[hop - 1]}) "
                                                                        f"is gone and no detour obeys the rules")
                return None
            logger.warning("microbatch %d: %s (stage %d) is gone; forward detoured to %s (stage %d)", r.microbatch,
                           r.nodes[hop], r.stages[hop - 1], amended.nodes[hop], amended.stages[hop - 1],
                           extra=event("detoured", microbatch=r.microbatch, gone=r.nodes[hop], to=amended.nodes[hop],
                                       to_stage=amended.stages[hop - 1]))
            self.result.detours += 1
            r = amended
        self.in_use[r.microbatch] = r
        return r, hop

    def _holder(self, microbatch: int) -> str | None:
        """The data holder of `microbatch` as the schedule says, None for a microbatch it does not have."""
        r = self.routes.get(microbatch)
        return r.origin if r is not None else None

    def _drop_left_out(self) -> set[str]:
        """The holders left out (see `left_out`) but this peer. What this peer keeps of their microbatches goes:
        stashed forwards (their memory slots), awaited backwards, the backwards it owes. Their forwards went no
        further than their holder's death or eviction, and a backward that still comes must not count."""
        left_out = set(self.left_out()) - {self.me}
        if not left_out:
            return left_out
        for mb in [mb for mb in self.worker.stashed if self._holder(mb) in left_out]:
            self.worker.drop(mb)
            self.result.left_out += 1
            logger.info("microbatch %d's stashed forward is dropped: its holder %s was declared gone", mb,
                        self._holder(mb))
        for mb in [mb for mb in self._owes if self._holder(mb) in left_out]:
            self._owes.discard(mb)
            self.expected -= 1
            self.awaited.forget(mb)
        return left_out

    def _undelivered(self, u: Undelivered) -> None:
        h = u.header
        r = self.in_use.get(h.microbatch)
        if h.run != self.run_id or h.iteration != self.iteration or h.epoch != self.schedule.epoch or r is None or \
                not self.attempts.is_current(h.microbatch, h.attempt) or r.origin in self._drop_left_out():
            return
        if h.direction == Direction.FORWARD and h.hop > 0 and u.unreachable and tuple(h.route) == r.nodes:
            self.unreachable.add(u.peer)
            self.awaited.forget(h.microbatch)
            self._emit(r, h.hop, Direction.FORWARD, u.tensor)  # detours around it
        else:  # a refusal or a timeout: the peer may have received it
            self.recovery.break_attempt(h.microbatch, u.peer, f"its {h.direction.name.lower()} could not be "
                                                              f"delivered to {u.peer}", maybe_ran=not u.unreachable)

    def _check_late(self) -> None:
        """Backwards late past their hop deadline make this peer check on the next hop (`overdue`); one still not
        back past its stall limit breaks its attempt there: that peer answers, but holds the iteration up."""
        self.awaited.check_overdue(self.attempts.over(), self.iteration)
        for mb, peer, attempt, waited in self.awaited.stalled(self.attempts.over()):
            if self.attempts.is_current(mb, attempt):
                limit = self.awaited.stall_limits[mb]
                self.recovery.break_attempt(mb, peer, f"{peer} has held it for {waited:.1f} s (stall limit "
                                                      f"{limit:.1f} s)", maybe_ran=True)

    def _check_awaited(self) -> None:
        """A microbatch whose forward went to a peer now gone cannot come back: that peer held its activations."""
        gone = self._gone_now()
        for mb, peer, attempt in self.awaited.lost_to(gone) if gone else ():
            if self.attempts.is_current(mb, attempt) and not self.attempts.is_over(mb, attempt):
                self.recovery.break_attempt(mb, peer, f"its activations were with {peer}, which is gone")

    def requeue(self, report: Requeue) -> None:
        """A report that an attempt of a microbatch broke: its holder runs it again, a relay drops what it keeps
        of it (`AttemptRecovery.requeue`)."""
        self.recovery.requeue(report)

    @property
    def disproved(self) -> set[str]:
        """Relays whose report against another peer this holder found false: gone around for the iteration."""
        return self.recovery.disproved

    def _handle(self, m: Inbound) -> None:
        h = m.header
        if self._holder(h.microbatch) in self._drop_left_out():  # declared gone since this was queued
            self.result.left_out += 1
            return
        attempt = self.attempts.current(h.microbatch)
        scheduled = self.routes.get(h.microbatch)
        mine = scheduled is not None and scheduled.origin == self.me  # only its holder starts a new attempt
        if self.attempts.stale(h.microbatch, h.attempt, mine=mine) and h.run == self.run_id and \
                h.iteration == self.iteration:
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
        if self.attempts.arrived(h.microbatch, h.attempt):  # a re-queued microbatch: what this peer holds of an
            self.awaited.forget(h.microbatch)                 # earlier attempt is stale
            if self.worker.drop(h.microbatch):
                logger.info("microbatch %d's attempt %d arrived: the stashed earlier attempt is dropped",
                            h.microbatch, h.attempt)
        if h.direction == Direction.FORWARD and h.hop > 0:
            self.attempts.carry(h.microbatch, h.counted)
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
                accumulate = stage not in self.attempts.counted(h.microbatch)
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
