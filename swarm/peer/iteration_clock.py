"""`IterationClock`: how long the swarm's iterations take as one peer sees them, and the deadlines that follow.

A peer waits for its part of an iteration, for a commit and for a microbatch's backward pass. Fixed timeouts would
be minutes on a fast swarm and too short on a slow one, so every deadline here is a multiple of what iterations
take: the schedule's prediction at first, then the median of the periods between the scheduler's recent commits
(which include averaging and the slowest peer), whichever is longer. A backward's deadline follows its own path
instead, once this peer has seen it come back in the schedule's epoch: the median of its recent round trips, or the
plan's, whichever is longer. One slow peer then stretches the deadlines of the paths through it, not every path's.

A dead host is silent (frozen, or its link cut): nothing is reset, so no send fails; only the schedule says that
an answer is late. The deadlines below keep what a silent death costs near two iterations plus a few seconds:
a backward late past 1.5 times its planned round trip, or a stage mate's averaging contribution late past one
iteration, makes the peer probe the one in question; a probe not answered within half an iteration (at least
`SILENCE_FLOOR` seconds, so that a live peer on a loaded machine is not taken for dead) makes it unreachable. A
peer that answers but does not pass the microbatch on is given up on later, past a stall limit (`STALL_FACTOR`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from scheduler.round_trips import round_trips
from scheduler.schedule import Schedule

DEADLINE_FACTOR = 5.0
MIN_ITERATION_DEADLINE = 60.0
RECENT_ITERATIONS = 5
HOP_DEADLINE_FACTOR = 1.5
HOP_DEADLINE_SLACK = 0.5
"""A microbatch's backward is overdue HOP_DEADLINE_FACTOR times its planned round trip (scaled to how much longer
than predicted iterations take) plus HOP_DEADLINE_SLACK seconds after its forward left this peer. Overdue only
means the next hop is probed (a one-byte message, once per attempt): a live one answers and is waited for, so a
tight deadline costs a probe, and a loose one adds to every silent death's stall."""
SILENCE_FLOOR = 3.0
"""The least seconds a probe of a peer in question waits for its answer, and a stage mate's averaging contribution
is waited for before that mate is probed: a live peer on a loaded 2-core machine answers a one-byte probe well
within it, a frozen one never does."""
PROBE_TIMEOUT_FACTOR = 0.5
"""A probe of a peer in question waits this many iterations (what iterations take) for its answer, at least
SILENCE_FLOOR seconds: on a slow swarm the probe may queue behind large messages on the same link."""
STALL_FACTOR = 5.0
"""A backward still not back STALL_FACTOR times its hop deadline after its forward left, plus two probe timeouts
for the next hop and for each peer after it on the path (those check on their own next hops first, and a dead one
is found within a probe timeout of its deadline), is given up on: the next hop answers, but holds the microbatch
(stuck behind its own full memory, or sitting on it on purpose), and the iteration would otherwise wait for its
deadline, then run again on the same peers."""
AVERAGING_OVERDUE_FACTOR = 1.0
"""A stage mate whose averaging contribution has not come this many iterations after this peer's own is probed
(at least SILENCE_FLOOR seconds after)."""


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
        self._measured: tuple[int, dict[int, list[float]]] = (-1, {})
        """(Epoch, microbatch -> seconds its recent first attempts took from this peer's forward to its backward)."""

    def committed(self, now: float) -> None:
        """A commit arrived at monotonic time `now`."""
        if self._last_commit is not None:
            self.periods = [*self.periods[-RECENT_ITERATIONS:], now - self._last_commit]
        self._last_commit = now

    def round_trip(self, epoch: int, microbatch: int, seconds: float) -> None:
        """The backward of `microbatch` (its first attempt, on its scheduled path) came back `seconds` after this
        peer sent its forward, in schedule epoch `epoch`; an older epoch's are forgotten (other paths)."""
        if epoch < self._measured[0] or not seconds >= 0:
            return
        if epoch > self._measured[0]:
            self._measured = (epoch, {})
        trips = self._measured[1].setdefault(microbatch, [])
        trips.append(seconds)
        del trips[:-RECENT_ITERATIONS]

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

    def probe_timeout(self, schedule: Schedule) -> float:
        """Seconds a probe of a peer in question waits for its answer before that peer is taken for unreachable."""
        return max(SILENCE_FLOOR, PROBE_TIMEOUT_FACTOR * self.expected(schedule))

    def averaging_overdue(self, schedule: Schedule) -> float:
        """Seconds into the stage averaging after which a stage mate not heard from yet is probed."""
        return max(SILENCE_FLOOR, AVERAGING_OVERDUE_FACTOR * self.expected(schedule))

    def hop_deadlines(self, schedule: Schedule, peer: str) -> dict[int, float]:
        """`peer`'s per-hop deadlines in `schedule`, by microbatch (see `HOP_DEADLINE_FACTOR`): none if the schedule
        carries no costs. The round trip each is a multiple of: the median this peer measured for that microbatch
        in this epoch (`round_trip`; `peer` is this clock's peer) if longer than planned, else the planned one,
        scaled to measured iterations until that microbatch came back once."""
        if self._round_trips[:2] != (schedule.epoch, peer):
            trips = round_trips(schedule)
            self._round_trips = (schedule.epoch, peer, {mb: t for (p, mb), t in trips.items() if p == peer})
        predicted = schedule.predicted_iteration_seconds or 0.0
        scale = self.expected(schedule) / predicted if predicted > 0 else 1.0
        measured = self._measured[1] if self._measured[0] == schedule.epoch else {}
        return {mb: HOP_DEADLINE_FACTOR * (max(t, statistics.median(measured[mb])) if measured.get(mb) else t * scale)
                + HOP_DEADLINE_SLACK for mb, t in self._round_trips[2].items()}

    def stall_limits(self, schedule: Schedule, peer: str) -> dict[int, float]:
        """Seconds after which `peer` gives up on a backward of each of its microbatches (`stall_limits_for` its
        hop deadlines): none if the schedule carries no costs."""
        return stall_limits_for(schedule, peer, self.hop_deadlines(schedule, peer), self.probe_timeout(schedule))


def stall_limits_for(schedule: Schedule, peer: str, hop_deadlines: Mapping[int, float],
                     probe_timeout: float) -> dict[int, float]:
    """`peer`'s stall limit for each microbatch with a hop deadline (see `STALL_FACTOR`): the further from the end
    of its path `peer` is, the longer it waits, so that the peer next to a stalled one gives up on it first and
    the others hear that the attempt broke, instead of blaming their own next hops."""
    after = {r.microbatch: len(r.nodes) - 1 - r.nodes.index(peer) for r in schedule.routes
             if peer in r.nodes}
    return {mb: STALL_FACTOR * d + 2 * probe_timeout * (1 + after.get(mb, 0)) for mb, d in hop_deadlines.items()}
