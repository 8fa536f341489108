"""`IterationClock`: how long the swarm's iterations take as one peer sees them, and the deadlines that follow.

A peer waits for its part of an iteration, for a commit and for a microbatch's backward pass. Fixed timeouts would
be minutes on a fast swarm and too short on a slow one, so every deadline here is a multiple of what iterations
take: the schedule's prediction at first, then the median of the periods between the scheduler's recent commits
(which include averaging and the slowest peer), whichever is longer.
"""

from __future__ import annotations

import statistics

from scheduler.round_trips import round_trips
from scheduler.schedule import Schedule

DEADLINE_FACTOR = 5.0
MIN_ITERATION_DEADLINE = 60.0
RECENT_ITERATIONS = 5
HOP_DEADLINE_FACTOR = 3.0
HOP_DEADLINE_SLACK = 2.0
"""A microbatch's backward is overdue HOP_DEADLINE_FACTOR times its planned round trip (scaled to how much longer
than predicted iterations take) plus HOP_DEADLINE_SLACK seconds after its forward left this peer."""


class IterationClock:
    """Commit periods seen by one peer, and its deadlines.

    :param cap: the most seconds this peer waits for its part of one iteration (`--iteration-deadline`)
    """

    def __init__(self, cap: float) -> None:
        self.cap = cap
        self.periods: list[float] = []
        """Seconds between the scheduler's consecutive commits, most recent last."""
        self._last_commit: float | None = None
        self._round_trips: tuple[int, str, dict[int, float]] = (-1, "", {})

    def committed(self, now: float) -> None:
        """A commit arrived at monotonic time `now`."""
        if self._last_commit is not None:
            self.periods = [*self.periods[-RECENT_ITERATIONS:], now - self._last_commit]
        self._last_commit = now

    def expected(self, schedule: Schedule) -> float:
        """What an iteration takes: the schedule's prediction, or the median of the recent commit periods when
        longer (they include averaging and the slowest peer); 0 if neither is known."""
        expected = schedule.predicted_iteration_seconds or 0.0
        if self.periods:
            expected = max(expected, statistics.median(self.periods[-RECENT_ITERATIONS:]))
        return expected

    def iteration_deadline(self, schedule: Schedule) -> float:
        """Seconds to wait for this peer's part of an iteration before reporting it stuck: DEADLINE_FACTOR times
        what iterations take, at least MIN_ITERATION_DEADLINE and at most the cap. A hang (a lost message, a peer
        dead but not yet expired) is noticed in a minute on a fast swarm, not after a fixed five."""
        expected = self.expected(schedule)
        if not expected > 0:
            return self.cap
        return min(self.cap, max(MIN_ITERATION_DEADLINE, DEADLINE_FACTOR * expected))

    def hop_deadlines(self, schedule: Schedule, peer: str) -> dict[int, float]:
        """`peer`'s per-hop deadlines in `schedule`, by microbatch (see `HOP_DEADLINE_FACTOR`): none if the schedule
        carries no costs."""
        if self._round_trips[:2] != (schedule.epoch, peer):
            trips = round_trips(schedule)
            self._round_trips = (schedule.epoch, peer, {mb: t for (p, mb), t in trips.items() if p == peer})
        predicted = schedule.predicted_iteration_seconds or 0.0
        scale = self.expected(schedule) / predicted if predicted > 0 else 1.0
        return {mb: HOP_DEADLINE_FACTOR * t * scale + HOP_DEADLINE_SLACK for mb, t in self._round_trips[2].items()}
