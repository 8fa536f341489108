"""Discrete-event simulation of one training iteration.

Every peer is a single server: one operation at a time, then `op_gap` of bookkeeping. A forward pass is
admitted only while the peer holds fewer than its memory slots of activations awaiting backward (TC1);
the loss and backward passes are always admitted, and a backward frees its slot. Messages cost the
link's time and do not occupy either end (the transport overlaps them with compute).

Among waiting operations a peer serves backward passes (and the loss) before forward passes
(`backward_first`, the default: it frees memory sooner and reproduces the reference simulator's makespans
exactly), or simply the earliest arrival first (`fifo`). A forward
that arrives while the peer runs another microbatch's forward is a collision (TC2): its wait is
counted. The makespan is when the last microbatch finishes its backward pass at its data holder.

Given a random generator and tables with measured `jitter`, each message between two peers takes its link's time
plus a deviation drawn from that jitter (never less than zero): one draw of the iteration as a loaded network
runs it (`scheduler.expected_makespan` averages many).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from scheduler.costs import CostTables

Priority = Literal["fifo", "backward_first"]

FORWARD, LOSS, BACKWARD = 0, 1, 2
KIND_NAMES = ("forward", "loss", "backward")


@dataclass(frozen=True)
class SimRoute:
    """One microbatch for the simulator: peer indices and stages, origin first, plus its injection time."""

    microbatch: int
    nodes: tuple[int, ...]
    stages: tuple[int, ...]
    inject_at: float = 0.0


@dataclass(frozen=True)
class Op:
    """One operation as it ran in the simulation (for Gantt charts and tests)."""

    node: int
    microbatch: int
    kind: int
    stage: int
    start: float
    end: float
    arrived: float


@dataclass
class SimResult:
    """What one simulated iteration looked like."""

    makespan: float
    """Seconds until the last backward pass ends at its data holder; inf if the run deadlocked."""
    finish: dict[int, float]
    """Microbatch -> time its backward pass ended at its origin."""
    busy: np.ndarray
    """[peer] seconds spent computing."""
    peak_memory: np.ndarray
    """[peer] most activations held at once."""
    collisions: int
    """Forward passes that had to wait for another microbatch's forward on the same peer (TC2)."""
    collision_delay: float
    """Total seconds those forward passes waited."""
    deadlocked: bool = False
    ops: list[Op] = field(default_factory=list)

    @property
    def idle(self) -> np.ndarray:
        return np.maximum(self.makespan - self.busy, 0.0) if np.isfinite(self.makespan) else self.busy * 0

    def summary(self, ids: tuple[str, ...] | list[str]) -> dict:
        """JSON-safe report: makespan, collisions, per-peer busy/idle seconds and peak memory."""
        return {
            "makespan": self.makespan if np.isfinite(self.makespan) else None,
            "deadlocked": self.deadlocked,
            "collisions": self.collisions,
            "collision_delay_seconds": round(self.collision_delay, 6),
            "peers": {
                pid: {
                    "busy_seconds": round(float(self.busy[i]), 6),
                    "idle_seconds": round(float(self.idle[i]), 6),
                    "peak_memory": int(self.peak_memory[i]),
                }
                for i, pid in enumerate(ids)
            },
        }


def simulate(tables: CostTables, routes: list[SimRoute], *, priority: Priority = "backward_first",
             record_ops: bool = False, rng: np.random.Generator | None = None) -> SimResult:
    """Simulate one iteration of `routes` on `tables`.

    :param routes: each microbatch's forward route; it returns to its origin for the loss, then runs backward
        along the reversed route.
    :param record_ops: keep every operation (for a Gantt chart); off in the planner's inner loop.
    :param rng: draw each message's deviation from `tables.jitter` (when measured); None = the links' own times.
    """
    n = tables.num_peers
    fwd = tables.forward
    msg = tables.message
    bwd_f, loss_t = tables.backward_factor, tables.loss_times()
    op_gap, inject_gap = tables.op_gap, tables.inject_gap
    memory = tables.memory
    backward_first = priority == "backward_first"
    jittered = rng is not None and tables.jitter is not None and len(tables.jitter) > 0
    deviations = iter(rng.choice(tables.jitter, size=sum(2 * len(r.nodes) for r in routes)) if jittered else ())

    busy_until = np.zeros(n)
    running_forward = [-1] * n  # microbatch whose forward a peer is running, for collision accounting
    held = np.zeros(n, dtype=int)
    peak = np.zeros(n, dtype=int)
    busy = np.zeros(n)
    queues: list[list] = [[] for _ in range(n)]
    idle = [True] * n
    finish: dict[int, float] = {}
    ops: list[Op] = []
    collisions, collision_delay = 0, 0.0

    # Event heap entries: (time, seq, kind, node, payload). kind 0 = task arrives, 1 = peer frees up.
    events: list = []
    seq = 0
    for r in routes:
        if len(r.nodes) != len(r.stages) or not r.nodes:
            raise ValueError(f"microbatch {r.microbatch}: nodes and stages must be non-empty and of equal length")
        # task = (route, position, kind, injected)
        heapq.heappush(events, (r.inject_at, seq, 0, r.nodes[0], (r, 0, FORWARD, True)))
        seq += 1

    def task_key(arrived: float, task_seq: int, task: tuple) -> tuple:
        kind_rank = 0 if (backward_first and task[2] != FORWARD) else 1
        return (kind_rank, arrived, 1 if task[3] else 0, task_seq)

    def try_start(v: int, now: float) -> None:
        nonlocal seq, collisions, collision_delay
        q = queues[v]
        best = None
        for i, (arrived, tseq, task) in enumerate(q):
            if task[2] == FORWARD and held[v] >= memory[v]:
                continue
            key = task_key(arrived, tseq, task)
            if best is None or key < best[0]:
                best = (key, i)
        if best is None:
            idle[v] = True
            return
        arrived, tseq, task = q.pop(best[1])
        route, pos, kind, injected = task
        stage = route.stages[pos]
        base = fwd[v, stage]
        dur = base if kind == FORWARD else (loss_t[v] if kind == LOSS else bwd_f * base)
        end = now + dur
        if kind == FORWARD:
            held[v] += 1
            peak[v] = max(peak[v], held[v])
            running_forward[v] = route.microbatch
        else:
            running_forward[v] = -1
        busy[v] += dur
        idle[v] = False
        gap = inject_gap if injected else op_gap
        busy_until[v] = end + gap
        if record_ops:
            ops.append(Op(v, route.microbatch, kind, stage, now, end, arrived))
        # Hand the next task to the next peer once this one ends.
        last = len(route.nodes) - 1
        if kind == FORWARD:
            if pos < last:
                nxt = (route, pos + 1, FORWARD, False)
                to = route.nodes[pos + 1]
            else:
                nxt = (route, 0, LOSS, False)
                to = route.nodes[0]
        elif kind == LOSS:
            nxt = (route, last, BACKWARD, False)
            to = route.nodes[last]
        else:
            held[v] -= 1
            if pos > 0:
                nxt = (route, pos - 1, BACKWARD, False)
                to = route.nodes[pos - 1]
            else:
                nxt, to = None, -1
                finish[route.microbatch] = end
        if nxt is not None:
            hop = msg[v, to] if not jittered or to == v else max(0.0, msg[v, to] + next(deviations))
            heapq.heappush(events, (end + hop, seq, 0, to, nxt))
            seq += 1
        heapq.heappush(events, (busy_until[v], seq, 1, v, None))
        seq += 1

    while events:
        now, eseq, ev, v, task = heapq.heappop(events)
        if ev == 0:
            if task[2] == FORWARD and not idle[v] and running_forward[v] not in (-1, task[0].microbatch):
                collisions += 1
                collision_delay += max(0.0, busy_until[v] - now)
            queues[v].append((now, eseq, task))
            if idle[v] and busy_until[v] <= now:
                try_start(v, now)
        else:
            if busy_until[v] <= now:
                try_start(v, now)

    deadlocked = len(finish) < len(routes)
    makespan = float("inf") if deadlocked else (max(finish.values()) if finish else 0.0)
    return SimResult(makespan=makespan, finish=finish, busy=busy, peak_memory=peak, collisions=collisions,
                     collision_delay=collision_delay, deadlocked=deadlocked, ops=ops)
