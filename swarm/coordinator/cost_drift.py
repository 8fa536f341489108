"""`CostDrift`: what moved away from the costs the newest epoch was planned on, and whether re-planning for it pays.

Two costs drift while a run goes on: a peer's compute (its passes slower or quicker than its epoch assumed:
`MeasuredSpeeds`) and a link's message time (its probes measure it slower or quicker: `LinkDrift`). Either has the
scheduler plan the paths again on the current costs, on the same placement from the next iteration, and publish that
plan only where its simulated iteration is `REPLAN_GAIN` shorter than the newest epoch's paths simulated on the same
current costs (`replan_gain`): a swarm slowed evenly (a loaded host) is not re-planned for nothing. Either way what was
weighed is the baseline of the next drift.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from scheduler.costs import CostTables, tables_from_dict
from scheduler.round_trips import schedule_sim_routes
from scheduler.schedule import Schedule
from scheduler.simulator import simulate
from swarm.coordinator.link_drift import LinkDrift
from swarm.coordinator.measured_speeds import MeasuredSpeeds
from swarm.events import event
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

REPLAN_GAIN = 0.05
"""How much shorter the re-planned paths' simulated iteration must be than the epoch's on the current costs. Lower
than a move's `REBALANCE_MIN_GAIN`: the same placement moves no state, so a new epoch costs its publication only."""


def replan_gain(epoch: Schedule, replanned: Schedule) -> float:
    """How much shorter (a fraction of it) `replanned`'s simulated iteration is than `epoch`'s paths simulated on
    `replanned`'s cost tables (the same peers on current costs). 0 where `epoch` places peers the tables lack."""
    tables = tables_from_dict(replanned.meta["costs"])
    if not set(epoch.placement) <= set(tables.ids):
        return 0.0
    was = float(simulate(tables, schedule_sim_routes(epoch, tables),
                         priority=epoch.meta.get("priority", "backward_first")).makespan)
    now = replanned.meta.get("on_time_seconds", replanned.predicted_iteration_seconds)
    if not was or now is None:
        return 0.0
    return 1.0 - float(now) / was


class CostDrift:
    """The drifts of one run's costs from its newest epoch's plan.

    :param speeds: the peers' measured speeds (the scheduler's, which its plans take)
    :param tables: the cost tables of the given peers' current records (the replanner's)
    :param links: whether links that drift count (the run's `swarm.link_drift`)
    """

    def __init__(self, speeds: MeasuredSpeeds, tables: Callable[[Mapping[str, PeerRecord]], CostTables], *,
                 links: bool = True) -> None:
        self.speeds = speeds
        self.links = LinkDrift() if links else None
        self._tables = tables
        self._now: CostTables | None = None

    def drifted(self, schedule: Schedule, peers: Mapping[str, PeerRecord]) -> dict[str, dict]:
        """What drifted from the newest epoch `schedule`'s plan, `peers` being its placed peers' current records:
        {"peers": peer -> (planned, measured slowdown), "links": hop -> (planned, current seconds)}, the kinds that
        drifted only (none: {})."""
        drift = {"peers": self.speeds.drifted(schedule.placement)}
        if self.links is not None:
            self._now = self._tables(peers)
            drift["links"] = self.links.drifted(schedule, self._now)
        return {k: v for k, v in drift.items() if v}

    def pays(self, drift: Mapping[str, dict], gain: float, start: int) -> bool:
        """Whether a re-plan for `drift` (from iteration `start`, on the current costs) whose paths are `gain` quicker
        than the newest epoch's (`replan_gain`, worked out where the plan was made) is worth publishing: `gain` >=
        `REPLAN_GAIN`. Said either way, for the log and the run's events; the current link times become the ones
        later drifts are measured from."""
        pays = gain >= REPLAN_GAIN
        if self.links is not None and self._now is not None:
            self.links.weighed(self._now)
        peers, links = drift.get("peers", {}), drift.get("links", {})
        said = [f"{p} {a:.2f}x -> {b:.2f}x" for p, (a, b) in sorted(peers.items())] + \
            [f"{h} {a:.3f} s -> {b:.3f} s" for h, (a, b) in sorted(links.items())]
        logger.log(logging.WARNING if pays else logging.INFO, "costs drifted from the plan (%s): re-planned paths "
                   "are %.0f%% quicker%s", ", ".join(said[:8]) + (", ..." if len(said) > 8 else ""), 100 * gain,
                   f": from iteration {start}" if pays else ", not worth an epoch",
                   extra=event("costs_drifted", peers={p: round(b, 3) for p, (_, b) in sorted(peers.items())},
                               links={h: round(b, 4) for h, (_, b) in sorted(links.items())}, gain=round(gain, 4),
                               replanned=pays, start_iteration=start))
        return pays
