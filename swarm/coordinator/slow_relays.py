"""`SlowRelays`: the relays whose own passes are slow for good, from the pace each reports.

A relay (a scheduled peer of a later stage, no data of its own) slower than the plan assumed holds up every microbatch
whose path crosses it: its holders' microbatches come back late (which `SlowHolders` must not take for their own), and
its stage mates wait for it in the averaging. No holder's report says which relay it was, so each relay says, after
each commit, how many passes it computed and in how many seconds (`Pace`). Its seconds per pass per layer are compared
with the other relays' of the same epoch (their last reports' median), and its pace over the seconds per layer it
announced (what the plan assumed) with `SLOW_PACE` and with the others' (median), whichever is more. A relay
`SLOW_PACE` times slower on both counts in `SLOW_OF` of its last `JUDGED` reports is slow for good; the scheduler
benches it (`SlowPeers`). Both counts: a relay that announced a slower machine and runs at that pace was planned for
what it is, even where the others run quicker than they announced; and one whose announcement was measured on a quiet
host (and is as quick as the others now) is not slow for that.

Self-reported, so a liar gains nothing: a relay that claims slow passes benches itself, and one that hides them is no
worse than before (a relay that stalls the run is found out by what its holders report, `Suspicions`). Slow links are
not seen here: the pace counts compute only.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Collection, Sequence

from scheduler.schedule import Schedule
from swarm.control.messages import Pace
from swarm.coordinator.slow_holders import SLOW_PACE

JUDGED = 3
SLOW_OF = 2
"""A relay is slow for good once `SLOW_OF` of its last `JUDGED` reports were slow: one slow iteration is a hiccup
(a checkpoint written, a state sent), two of three a machine busy with something else."""
MIN_OTHERS = 2
"""Reports of other relays a verdict needs: against a single other, the slow one may be that other."""


class SlowRelays:
    """The relays' last paces and verdicts in one run.

    :param layers_per_stage: the model's layers per stage (a pass of a stage with more layers takes longer)
    """

    def __init__(self, layers_per_stage: Sequence[int]) -> None:
        self.layers_per_stage = tuple(layers_per_stage)
        self._pace: dict[str, tuple[float, float]] = {}
        """Relay -> (seconds per pass per layer, the same over its announced seconds per layer) of its last report."""
        self._verdicts: dict[str, deque[bool]] = {}

    def note(self, report: Pace, schedule: Schedule, announced: float) -> list[str]:
        """A relay's pace under its epoch `schedule`, having announced `announced` seconds per layer: [the relay]
        if this report makes it slow for good (its verdicts start over), else []. A report of a peer that `schedule`
        does not place at a later stage is not a relay's, and is ignored."""
        stage = schedule.placement.get(report.peer)
        if not stage or stage >= len(self.layers_per_stage) or report.operations <= 0 or announced <= 0:
            return []
        seconds = report.compute / report.operations / max(1, self.layers_per_stage[stage])
        self._pace[report.peer] = (seconds, seconds / announced)
        others = self._others(report.peer, schedule)
        if len(others) < MIN_OTHERS:
            return []
        (seconds, ratio), (their_seconds, their_ratios) = self._pace[report.peer], zip(*others, strict=True)
        # over its announcement: at least SLOW_PACE x, and so much more than the others are (a loaded host slows all)
        slow = seconds >= SLOW_PACE * statistics.median(their_seconds) and \
            ratio >= SLOW_PACE * max(1.0, statistics.median(their_ratios))
        verdicts = self._verdicts.setdefault(report.peer, deque(maxlen=JUDGED))
        verdicts.append(slow)
        if sum(verdicts) < SLOW_OF:
            return []
        verdicts.clear()
        return [report.peer]

    def slowdown(self, relay: str, schedule: Schedule) -> float:
        """How many times the other relays' median seconds per pass (per layer) `relay`'s last report took (0 if
        unknown)."""
        others = self._others(relay, schedule)
        if relay not in self._pace or not others:
            return 0.0
        return self._pace[relay][0] / max(statistics.median(s for s, _ in others), 1e-9)

    def _others(self, relay: str, schedule: Schedule) -> list[tuple[float, float]]:
        """The last paces of the relays of `schedule` but `relay`."""
        return [self._pace[p] for p, st in schedule.placement.items() if st > 0 and p != relay and p in self._pace]

    def why(self, relay: str, schedule: Schedule) -> str:
        """Why `relay` is benched, for the log."""
        return f"slow for good (its passes took {self.slowdown(relay, schedule):.1f}x the other relays')"

    def forget(self, peers: Collection[str]) -> None:
        """`peers` left the run or were benched: placed again, each is judged afresh."""
        for p in peers:
            self._pace.pop(p, None)
            self._verdicts.pop(p, None)
