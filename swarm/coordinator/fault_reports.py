"""`FaultReports`: members' reports that a stage-group peer's averaging input was proof of a fault, into evictions.

A member refuses a contribution whose weight is above what the schedule allows, whose gradient is far outside
the stage's history, or that is not finite (`swarm.stage_group.allgather`), and reports it (`Faulty`). One report
proves nothing (the reporter may be the liar), so an iteration counts against a suspect only when two different
members of its stage group report it for that iteration: in a group of three, one faulty member is voted out by
the two honest ones and cannot vote out either of them. And since honest members agree about an honest outlier
too (a rare gradient spike), the suspect is evicted only once that happened in `STRIKES` different iterations.
A weight above its bound is not reported: an honest member's visits can exceed the schedule's through detours.
"""

from __future__ import annotations

from collections.abc import Mapping

VOTES = 2
"""Distinct reporters of one stage group that make an iteration count against a suspect."""
STRIKES = 2
"""Iterations that must count against a suspect before it is evicted."""
MAX_TRACKED = 1024
"""(suspect, iteration) pairs remembered; the oldest are forgotten first."""


class FaultReports:
    """Who reported whom, per iteration; `report` says when a suspect is to be evicted."""

    def __init__(self) -> None:
        self._reporters: dict[tuple[str, int], set[str]] = {}
        self._strikes: dict[str, set[int]] = {}

    def report(self, reporter: str, suspect: str, iteration: int, placement: Mapping[str, int]) -> str | None:
        """Note `reporter`'s report; why to evict `suspect` now, or None. Reports between peers that are not both
        in `placement` (the epoch they averaged under) on one stage count for nothing."""
        stage = placement.get(suspect)
        if reporter == suspect or stage is None or placement.get(reporter) != stage:
            return None
        if len(self._reporters) >= MAX_TRACKED:
            del self._reporters[next(iter(self._reporters))]
        reporters = self._reporters.setdefault((suspect, iteration), set())
        reporters.add(reporter)
        if len(reporters) < VOTES:
            return None
        strikes = self._strikes.setdefault(suspect, set())
        strikes.add(iteration)
        if len(strikes) < STRIKES:
            return None
        return f"its stage {stage} averaging input was refused as faulty by {len(reporters)} members of its " \
               f"group ({', '.join(sorted(reporters)[:3])}) in iterations {sorted(strikes)[-STRIKES:]}"
