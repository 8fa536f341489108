"""`OperationQueue`: which operation a peer runs next in an iteration, chosen as the planner's simulator chooses.

The simulator (`scheduler.simulator`, `backward_first`) runs waiting backward passes and losses first (they free
memory), then forwards and due injections by arrival, a relay's forward before an injection due at the same time;
forwards and injections wait while every memory slot holds activations. Following the same rule on the runtime is
what makes a measured iteration follow the plan the simulator scored.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable

from scheduler.schedule import Route
from swarm.net.delivery import Inbound
from swarm.wire import Direction

IDLE_WAIT = 0.2
"""Seconds at most to wait for a message when nothing can run (re-checks deadlines and reports that often)."""


class OperationQueue:
    """Accepted messages waiting for their operation, and this holder's microbatches not injected yet."""

    def __init__(self, own: list[Route]) -> None:
        """:param own: this holder's routes, in injection order (`inject_after` seconds after `restart`)"""
        self._ready: list[tuple[tuple[int, float, int, int], Inbound]] = []
        """Each message with the key that orders it: (0 for a backward or loss, 1 for a forward; arrival; 0;
        arrival order). An injection's key is (1, due time, 1, -1)."""
        self._arrivals = itertools.count()
        self.pending: list[Route] = list(own)
        """This holder's microbatches not injected yet, the next first."""
        self.start = time.monotonic()

    def restart(self) -> None:
        """Injections are due `inject_after` seconds from now."""
        self.start = time.monotonic()

    def add(self, m: Inbound) -> None:
        h = m.header
        first = h.direction == Direction.BACKWARD or (h.direction == Direction.FORWARD and h.hop == 0)
        self._ready.append(((0 if first else 1, time.monotonic(), 0, next(self._arrivals)), m))

    def next(self, room: bool, supersedes: Callable[[Inbound], bool]) -> Route | Inbound | None:
        """Take the next operation: a due injection (its route) or a message; None when none can run now.

        :param room: whether a memory slot is free (forwards and injections wait for one otherwise)
        :param supersedes: whether a forward frees a slot itself (a re-queued attempt of a stashed microbatch)
        """
        best: tuple[tuple[int, float, int, int], int] | None = None
        for i, (key, m) in enumerate(self._ready):
            if (key[0] == 0 or room or supersedes(m)) and (best is None or key < best[0]):
                best = (key, i)
        if room and self.pending:
            due = self.start + self.pending[0].inject_after
            if due <= time.monotonic() and (best is None or (1, due, 1, -1) < best[0]):
                return self.pending.pop(0)
        if best is None:
            return None
        return self._ready.pop(best[1])[1]

    def idle_wait(self, room: bool) -> float:
        """Seconds to wait for a message when nothing can run: until the next injection is due, at most
        `IDLE_WAIT`."""
        if self.pending and room:
            return max(0.0, min(IDLE_WAIT, self.start + self.pending[0].inject_after - time.monotonic()))
        return IDLE_WAIT

    def inject_now(self, r: Route) -> None:
        """Inject `r` (a re-queued microbatch) before anything else pending, at once."""
        self.pending.insert(0, dataclasses.replace(r, inject_after=0.0))

    def injecting(self, microbatch: int) -> bool:
        """Whether `microbatch` is still to be injected."""
        return any(p.microbatch == microbatch for p in self.pending)

    def forwards_waiting(self) -> int:
        return sum(key[0] for key, _ in self._ready)
