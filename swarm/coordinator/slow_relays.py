"""`SlowRelays`: the relays whose own passes are slow for good, from the pace each reports.

A relay (a scheduled peer of a later stage, no data of its own) slower than the plan assumed holds up every microbatch
whose path crosses it: its holders' microbatches come back late (which `SlowHolders` must not take for their own), and
its stage mates wait for it in the averaging. No holder's report says which relay it was, so each relay says, after
each commit, how many passes it computed and in how many seconds (`Pace`). Its seconds per pass per layer are compared
with the other relays' of the same iteration and epoch (their median), and its pace over the seconds per layer it
announced (what the plan assumed) with `SLOW_PACE` and with the others' (median), whichever is more. A relay
`SLOW_PACE` times slower on both counts in `SLOW_OF` of its last `JUDGED` judged reports is slow for good; the
scheduler benches it (`SlowPeers`). Both counts: a relay that announced a slower machine and runs at that pace was
planned for what it is, even where the others run quicker than they announced; and one whose announcement was measured
on a quiet host (and is as quick as the others now) is not slow for that. The same iteration: a host whose load comes
in bursts slows every relay of the iterations it hits, and a report held against the others' of a quieter iteration
would take the burst for the relay's own (a report waits, up to `KEPT` iterations, for `MIN_OTHERS` others of its
iteration).

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
KEPT = 4
"""Iterations whose reports are kept for the others of their iteration to come (older ones are never judged)."""


class SlowRelays:
    """The relays' recent paces and verdicts in one run.

    :param layers_per_stage: the model's layers per stage (a pass of a stage with more layers takes longer)
    """

    def __init__(self, layers_per_stage: Sequence[int]) -> None:
        self.layers_per_stage = tuple(layers_per_stage)
        self._paces: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}
        """(iteration, epoch) -> relay -> (seconds per pass per layer, that over its announced seconds per layer)."""
        self._judged: dict[tuple[int, int], set[str]] = {}
        self._verdicts: dict[str, deque[bool]] = {}
        self._slowdown: dict[str, float] = {}
        """Relay -> its last judged report's seconds per pass over the others' median."""

    def note(self, report: Pace, schedule: Schedule, announced: float) -> list[str]:
        """A relay's pace under its epoch `schedule`, having announced `announced` seconds per layer: the relays
        this report lets be judged (itself, or those of its iteration that waited for others) that are now slow for
        good (their verdicts start over). A report of a peer that `schedule` does not place at a later stage is not a
        relay's, and is ignored; so is one of an iteration `KEPT` older than the newest reported."""
        stage = schedule.placement.get(report.peer)
        if not stage or stage >= len(self.layers_per_stage) or report.operations <= 0 or announced <= 0:
            return []
        key = (report.iteration, schedule.epoch)
        newest = max((it for it, _ in self._paces), default=report.iteration)
        if report.iteration <= newest - KEPT:
            return []
        for old in [k for k in self._paces if k[0] <= max(newest, report.iteration) - KEPT]:
            del self._paces[old]
            self._judged.pop(old, None)
        seconds = report.compute / report.operations / max(1, self.layers_per_stage[stage])
        paces = self._paces.setdefault(key, {})
        paces[report.peer] = (seconds, seconds / announced)
        if len(paces) <= MIN_OTHERS:
            return []
        judged = self._judged.setdefault(key, set())
        slow = [p for p in paces if p not in judged and self._judge(p, paces)]
        judged.update(paces)
        return slow

    def _judge(self, relay: str, paces: dict[str, tuple[float, float]]) -> bool:
        """Whether `relay`'s report among `paces` (one iteration's) makes it slow for good."""
        (seconds, ratio), others = paces[relay], [v for p, v in paces.items() if p != relay]
        their_seconds, their_ratios = zip(*others, strict=True)
        self._slowdown[relay] = seconds / max(statistics.median(their_seconds), 1e-9)
        # over its announcement: at least SLOW_PACE x, and so much more than the others are (a loaded host slows all)
        slow = self._slowdown[relay] >= SLOW_PACE and ratio >= SLOW_PACE * max(1.0, statistics.median(their_ratios))
        verdicts = self._verdicts.setdefault(relay, deque(maxlen=JUDGED))
        verdicts.append(slow)
        if sum(verdicts) < SLOW_OF:
            return False
        verdicts.clear()
        return True

    def slowdown(self, relay: str) -> float:
        """How many times the other relays' median seconds per pass (per layer) `relay`'s last judged report took
        (0 if none was)."""
        return self._slowdown.get(relay, 0.0)

    def why(self, relay: str) -> str:
        """Why `relay` is benched, for the log."""
        return f"slow for good (its passes took {self.slowdown(relay):.1f}x the other relays')"

    def forget(self, peers: Collection[str]) -> None:
        """`peers` left the run or were benched: placed again, each is judged afresh."""
        for p in peers:
            self._verdicts.pop(p, None)
            self._slowdown.pop(p, None)
            for paces in self._paces.values():
                paces.pop(p, None)
