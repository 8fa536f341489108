"""`PipelineExecutor`: one peer's part of one iteration, driven by the messages it receives.

The networked counterpart of `peers.inprocess.InProcessSwarm`'s loop, calling the same `StageWorker`
methods. A data holder injects its microbatches (at their planned times, while it has memory slots),
computes their loss when they come back and ends their backward; every peer forwards and backpropagates
what its stage is sent. Waiting backward passes go before forward passes (they free memory), and a
forward the worker cannot admit (TC1) waits until a backward frees a slot.

Nothing from the network is trusted: a message must match the schedule (its microbatch's route and
stages, the epoch, and the sender being the previous hop), and the worker checks the tensor itself.
Anything else is logged with the sender's peer id and dropped; the iteration goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from peers.worker import MemoryLimitError, StageWorker, WorkerError
from scheduler.schedule import Route, Schedule
from swarm.timeline import Timeline
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inbound:
    """One accepted message: who sent it, its header, its tensor."""

    sender: str
    header: HopHeader
    tensor: torch.Tensor


Send = Callable[[str, HopHeader, torch.Tensor], None]
"""send(peer_id, header, tensor): hand a message to the transport (may return before delivery)."""
Receive = Callable[[float], list[Inbound]]
"""receive(timeout): this iteration's messages that arrived, waiting up to `timeout` for the first."""


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
    tokens: int = 0
    backward_done: int = 0
    started: float = field(default_factory=time.time)
    finished: float = 0.0
    dropped: int = 0
    """Messages refused (not matching the schedule, or refused by the worker)."""


def expected_backwards(schedule: Schedule, peer: str) -> int:
    """Backward passes `peer` runs per iteration: one per route through it, one per route it originates."""
    return sum(r.peers.count(peer) + (r.origin == peer) for r in schedule.routes)


class PipelineExecutor:
    """Runs one iteration of `schedule` on this peer's `worker`."""

    def __init__(self, *, me: str, worker: StageWorker, schedule: Schedule, run_id: str, iteration: int,
                 send: Send, batches: dict[int, torch.Tensor] | None = None,
                 hold: Callable[[Inbound], None] | None = None, timeline: Timeline | None = None) -> None:
        """:param hold: takes messages of a newer schedule epoch (from peers that switched first) for later
        :param timeline: records each operation's span (forward, backward, ...)
        """
        self.me, self.worker, self.schedule, self.run_id, self.iteration = me, worker, schedule, run_id, iteration
        self.timeline = timeline
        self.send = send
        self.hold = hold
        self.routes = {r.microbatch: r for r in schedule.routes}
        self.own = sorted((r for r in schedule.routes if r.origin == me), key=lambda r: (r.inject_after, r.microbatch))
        self.batches = batches or {}
        missing = [r.microbatch for r in self.own if r.microbatch not in self.batches]
        if missing:
            raise ValueError(f"no tokens for this holder's microbatches {missing}")
        self.expected = expected_backwards(schedule, me)
        self.result = IterationResult(iteration=iteration)
        self._deferred: list[Inbound] = []

    def run(self, receive: Receive, *, deadline: float, aborted: Callable[[], bool] = lambda: False
            ) -> IterationResult:
        """Process until every backward this peer expects has run.

        :param aborted: polled between messages; True abandons the iteration (IterationAborted)
        :raises IterationTimeout: past `deadline` seconds
        """
        start = time.monotonic()
        pending = list(self.own)
        while self.result.backward_done < self.expected:
            if aborted():
                raise IterationAborted(f"iteration {self.iteration} abandoned for a newer schedule")
            now = time.monotonic() - start
            while pending and pending[0].inject_after <= now and len(self.worker.stashed) < self.worker.memory_slots:
                self._inject(pending.pop(0))
            if self.result.backward_done >= self.expected:
                break
            if time.monotonic() - start > deadline:
                raise IterationTimeout(
                    f"iteration {self.iteration}: {self.result.backward_done}/{self.expected} backward passes after "
                    f"{deadline:.0f} s (stashed {self.worker.stashed}, {len(self._deferred)} forwards waiting)")
            wait = 0.2
            if pending and len(self.worker.stashed) < self.worker.memory_slots:
                wait = max(0.0, min(wait, pending[0].inject_after - now))
            messages = receive(wait)
            # backward passes (and returning activations, whose loss starts a backward) before forwards
            messages.sort(key=lambda m: 0 if (m.header.direction == Direction.BACKWARD or m.header.hop == 0) else 1)
            for m in messages:
                self._handle(m)
        self.result.finished = time.time()
        return self.result

    # ---- steps of a microbatch --------------------------------------------------------------------
    def _inject(self, r: Route) -> None:
        tokens = self.batches[r.microbatch]
        start = time.time()
        act = self.worker.inject(r.microbatch, tokens)
        self._span("inject", start, r.microbatch, 0)
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
        start = time.time()
        loss, grad = self.worker.loss(r.microbatch, act)
        self._span("loss", start, r.microbatch, 0)
        self.result.loss_sum += loss
        self.result.losses += 1
        if r.peers:
            self._emit(r, len(r.peers), Direction.BACKWARD, grad)
        else:
            start = time.time()
            self.worker.backward(r.microbatch, grad)
            self._span("backward", start, r.microbatch, 0)
            self.result.backward_done += 1

    def _emit(self, r: Route, hop: int, direction: Direction, tensor: torch.Tensor) -> None:
        header = HopHeader(run=self.run_id, iteration=self.iteration, microbatch=r.microbatch, route=r.nodes, hop=hop,
                           direction=direction, epoch=self.schedule.epoch, dtype="", shape=(),
                           stages=(0, *r.stages))
        self.send(r.nodes[hop], header, tensor)

    def _handle(self, m: Inbound) -> None:
        h = m.header
        if h.epoch > self.schedule.epoch and self.hold is not None:
            self.hold(m)
            return
        why = self._mismatch(m)
        if why:
            self.result.dropped += 1
            logger.warning("dropped %s of microbatch %d from %s: %s", h.direction.name.lower(), h.microbatch,
                           m.sender, why)
            return
        r = self.routes[h.microbatch]
        try:
            if h.direction == Direction.FORWARD and h.hop == 0:
                self._loss(r, m.tensor)
            elif h.direction == Direction.FORWARD:
                try:
                    start = time.time()
                    act = self.worker.forward(h.microbatch, m.tensor, stage=r.stages[h.hop - 1])
                except MemoryLimitError:
                    self._deferred.append(m)
                    return
                self._span("forward", start, h.microbatch, r.stages[h.hop - 1])
                nxt = h.hop + 1 if h.hop < len(r.peers) else 0
                self._emit(r, nxt, Direction.FORWARD, act)
            else:
                stage = r.stages[h.hop - 1] if h.hop > 0 else None
                start = time.time()
                grad = self.worker.backward(h.microbatch, m.tensor, stage=stage)
                self._span("backward", start, h.microbatch, 0 if stage is None else stage)
                self.result.backward_done += 1
                if h.hop > 0:
                    self._emit(r, h.hop - 1, Direction.BACKWARD, grad)
                self._retry_deferred()
        except WorkerError as e:
            self.result.dropped += 1
            logger.warning("worker refused %s of microbatch %d from %s: %s", h.direction.name.lower(), h.microbatch,
                           m.sender, e)

    def _retry_deferred(self) -> None:
        waiting, self._deferred = self._deferred, []
        for m in waiting:
            self._handle(m)

    def _mismatch(self, m: Inbound) -> str | None:
        """Why a message does not fit the schedule (None when it does)."""
        h = m.header
        r = self.routes.get(h.microbatch)
        if h.run != self.run_id or h.iteration != self.iteration:
            return f"run {h.run!r} iteration {h.iteration}, expected {self.run_id!r} iteration {self.iteration}"
        if h.epoch != self.schedule.epoch:
            return f"schedule epoch {h.epoch}, this iteration runs epoch {self.schedule.epoch}"
        if r is None:
            return "no such microbatch in the schedule"
        if tuple(h.route) != r.nodes or (h.stages and tuple(h.stages) != (0, *r.stages)):
            return "route or stages differ from the schedule"
        if h.route[h.hop] != self.me:
            return f"hop {h.hop} is not this peer"
        last = len(r.nodes) - 1
        if h.direction == Direction.FORWARD:
            expected_sender = r.nodes[last] if h.hop == 0 else r.nodes[h.hop - 1]
        elif h.direction == Direction.BACKWARD:
            expected_sender = r.nodes[0] if h.hop == last else r.nodes[h.hop + 1]
        else:
            return f"direction {h.direction.name} is not a pipeline message"
        if m.sender != expected_sender:
            return f"sent by {m.sender}, the schedule says {expected_sender}"
        return None
