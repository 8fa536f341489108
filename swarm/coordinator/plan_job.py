"""`PlanJob`: one re-plan, asked for by the scheduler's loop and made off it; `rebase`, the plan moved to a later
start when commits went on while it was made.

A re-plan of a 20-peer swarm takes seconds on a loaded host (a median 9-10 s with the epoch's DHT store, up to 17 s);
made on the scheduler's loop, it held the commits, pings and reads of the records that long: the peers, their part of
the iteration done, waited for a commit that sat in the loop's inbox. A job takes a snapshot of what the plan reads
(the records with their measured speeds applied, the epochs, the shard positions, who holds no state, the holders'
shares) on the loop, so that `run` may go on in another thread while the loop commits on. No I/O here.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.schedule import Schedule
from swarm.coordinator.cost_drift import replan_gain
from swarm.coordinator.epochs import EpochHistory
from swarm.coordinator.reckoning import reckoned_alike
from swarm.coordinator.replanner import NoDataHolder, Replanner
from swarm.wire import PeerRecord

_numbers = itertools.count(1)


@dataclass
class PlanJob:
    """A new epoch of `records` (speeds applied) from iteration `start`, asked for with `asked_at` iterations
    committed and epoch `after` the newest. `why` says what asked for it: "membership" (a peer gone, leaving,
    joining or sitting out; `change` names it, to try again later if it cannot be planned), "restart" (an iteration
    that cannot finish runs again), "pace" (holders' shares, or costs that drifted: `drift`, published only where it
    pays), "periodic" (the SWARM-style planner's rebalancing), "resume" (a successor's first epoch).

    `peers` are the records as asked (a job redone for a later start applies the speeds of then)."""

    why: str
    peers: dict[str, PeerRecord]
    records: dict[str, PeerRecord]
    start: int
    asked_at: int
    history: EpochHistory
    shard_positions: dict[str, dict[str, int]]
    handing_over: tuple[str, ...] = ()
    stateless: frozenset[str] = frozenset()
    shares: dict[str, float] = field(default_factory=dict)
    change: tuple | None = None
    drift: Mapping | None = None
    number: int = field(default_factory=lambda: next(_numbers))
    """Tells jobs apart in the log."""
    outcome: Schedule | Exception | None = None
    """The plan, or why there is none (`NoDataHolder`, or the planner's `RuntimeError` / `ValueError`); None until
    `run`."""
    seconds: float = 0.0
    """How long `run` took."""
    gain: float = 0.0
    """For a plan asked for by `drift`: how much quicker its paths are than the epoch's (`replan_gain`)."""

    @property
    def after(self) -> int:
        """The epoch the plan follows."""
        return self.history.latest.epoch

    @property
    def rerun(self) -> bool:
        """Whether the plan runs the iteration in progress again (rather than starting at the next one)."""
        return self.start <= self.asked_at

    def run(self, replanner: Replanner) -> None:
        """Make the plan (any thread): `outcome` is the schedule, or the error that kept it from being made."""
        started = time.perf_counter()
        try:
            self.outcome = replanner.replan(self.records, self.history, start_iteration=self.start,
                                            shard_positions=self.shard_positions,
                                            handing_over=list(self.handing_over), stateless=self.stateless,
                                            shares=self.shares)
        except (RuntimeError, ValueError) as e:  # NoDataHolder is a RuntimeError
            self.outcome = e
        else:
            if self.drift:  # a simulation of the epoch's paths: off the loop too
                self.gain = replan_gain(self.history.latest, self.outcome)
        finally:
            self.seconds = time.perf_counter() - started

    @property
    def no_data_holder(self) -> bool:
        return isinstance(self.outcome, NoDataHolder)


def rebase_start(job: PlanJob, completed: int, epochs: EpochHistory) -> int | None:
    """Where `job`'s plan starts now that `completed` iterations are committed: where it was asked to if none was
    committed meanwhile; else at the next iteration, the one in progress going on under the epoch that runs it (it
    was started under that epoch, and what would have run again has committed after all). None when the plan must be
    made again: the epoch the new one would follow is not the one it was planned after (a newer one came), or one
    started meanwhile against which the plan's joiners, their restore sources or the moves it carries over come out
    otherwise than against the epoch it was reckoned against (`reckoned_alike`)."""
    if epochs.latest is None or epochs.latest.epoch != job.after:
        return None
    if completed == job.asked_at:
        return job.start
    start = completed + 1
    before = job.history.in_force(job.start - 1) if job.start > 0 else None
    now_before = epochs.in_force(start - 1)
    if before is not None and before.epoch == now_before.epoch:
        return start
    alike = isinstance(job.outcome, Schedule) and \
        reckoned_alike(job.outcome, job.history.latest, before, now_before, job.records, job.stateless)
    return start if alike else None


def rebased(schedule: Schedule, start: int, shard_positions: Mapping[str, Mapping[str, int]]) -> Schedule:
    """`schedule` starting at iteration `start`, its shards where the last commit left them."""
    schedule.meta.update(start_iteration=start, shard_positions={k: dict(v) for k, v in shard_positions.items()})
    return schedule
