"""`LinkDrift`: the hops whose measured message times moved away from those the newest epoch's paths were planned on.

Every plan takes the links as the peers' probes measured them then (`PeerRecord.links`); probes go on all run long,
so the records follow a link that slowed (a volunteer's upload taken by another job, a congested route) or recovered,
but nothing re-planned for it: the paths kept crossing a slowed link until a membership change. A hop of the newest
epoch's paths whose message time on the current records is `DRIFT` times off the planned one, and off by
`LINK_FLOOR` of the planned iteration at least (a loopback link going from 2 to 4 ms is no reason to re-plan), has
the scheduler weigh a re-plan of the paths, as for a peer whose compute drifted (`MeasuredSpeeds`); weighed, the
current times become the ones compared with (no re-plan until they drift again).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from scheduler.costs import CostTables, tables_from_dict
from scheduler.schedule import Schedule
from swarm.coordinator.measured_speeds import DRIFT

LINK_FLOOR = 0.02
"""How much of the planned iteration a hop's message time must have moved by, besides `DRIFT` times, to count."""


def hops(schedule: Schedule) -> Iterator[tuple[str, str]]:
    """Every (sender, receiver) of `schedule`'s paths: each forward hop, the last peer's back to the origin included,
    and the same links the other way, which the gradients cross (links are directed: an upload slows on its own)."""
    for route in schedule.routes:
        nodes = route.nodes
        for a, b in (*zip(nodes, nodes[1:]), (nodes[-1], nodes[0])):
            yield a, b
            yield b, a


def crossings(schedule: Schedule) -> Counter[tuple[str, str]]:
    """How often `schedule`'s paths cross each link, either way, by its pair of peers (sorted)."""
    return Counter(tuple(sorted(hop)) for hop in hops(schedule))


def busiest_link(schedule: Schedule) -> tuple[str, str]:
    """The pair of peers (sorted) whose link `schedule`'s paths cross most often."""
    return crossings(schedule).most_common(1)[0][0]


class LinkDrift:
    """The message times of the newest epoch's hops, as planned or as last weighed."""

    def __init__(self) -> None:
        self._epoch: int | None = None
        self._base: dict[tuple[str, str], float] = {}

    def drifted(self, schedule: Schedule, now: CostTables) -> dict[str, tuple[float, float]]:
        """The hops of the newest epoch `schedule` whose message time in `now` (the current records' tables) moved
        `DRIFT` times and `LINK_FLOOR` of its planned iteration away from the planned (or last weighed) one:
        "sender->receiver" -> (then, now) seconds (none for an epoch that carries no costs)."""
        if schedule.epoch != self._epoch:
            self._epoch, self._base = schedule.epoch, {}
            if "costs" in schedule.meta:
                self._base = self._times(set(hops(schedule)), tables_from_dict(schedule.meta["costs"]))
        floor = LINK_FLOOR * (schedule.predicted_iteration_seconds or 0.0)
        current = self._times(set(self._base), now)
        return {f"{a}->{b}": (was, current[a, b]) for (a, b), was in sorted(self._base.items())
                if (a, b) in current and abs(current[a, b] - was) >= floor and
                max(current[a, b], was) >= DRIFT * max(min(current[a, b], was), 1e-9)}

    def weighed(self, now: CostTables) -> None:
        """A re-plan was weighed on `now`: its times are the ones later drifts are measured from."""
        self._base.update(self._times(set(self._base), now))

    @staticmethod
    def _times(pairs: set[tuple[str, str]], tables: CostTables) -> dict[tuple[str, str], float]:
        index = {p: i for i, p in enumerate(tables.ids)}
        return {(a, b): float(tables.message[index[a], index[b]]) for a, b in pairs if a in index and b in index}
