"""`CommitTracker`: the data holders' `done` reports, turned into commits of whole iterations.

An iteration is committed once every data holder of the epoch running it has reported it done under that epoch,
but those left out of it: a holder declared gone during the iteration is excused (the others' work is committed
without its draws, which the holder that takes its shard over draws again), and so is one declared gone or evicted
before its report came (its report is not counted). Only then do the peers average and step. The commit carries
every shard's position after it, so a shard that changes holder starts where the last commit left it.

A holder late against the others is excused too (`late`, `excuse_late`): once half of the holders counted have
reported, one still awaited past their median report by max(3 s, half the median) (`swarm.lateness`, the stage
averaging's rule for its members) is left out of the commit. It is not taken for gone, so a load spike costs the
slow holder one iteration's draws (they go back), never its place; its stage mates probe it (a frozen one is found
by their unanswered probes, a probe's timeout later). What this buys: a frozen holder held every iteration it ran in
until its record expired (16-26 s), and a holder whose microbatches were re-queued around a dead relay held the
others for its whole recovery (10-15 s past the cutoff in the 20-peer churn runs of 2026-12-06). A holder left out
for being late gets `LATE_AGAIN_PATIENCE` times the margin in the next iteration, and if it is left out then too,
the iteration after waits for it as long as it takes (a holder stuck for good is the iteration deadline's, as
before): one up to 2.5x slower than the others has every other iteration counted, one slower still every third, and
its shard moves on. A holder left out that often is given fewer microbatches (`HolderShares`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import replace

from scheduler.costs import jitter_quantiles, pooled_jitter
from scheduler.schedule import Schedule
from swarm.control.messages import Commit, Done
from swarm.events import event
from swarm.lateness import overdue
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

LATE_AGAIN_PATIENCE = 3.0
"""How many times the margin a holder the last commit left out for being late gets."""
LATE_STREAK = 2
"""Commits in a row a holder may be left out of for being late; the next one waits for it."""


class CommitTracker:
    """Reports by (iteration, epoch) and reporter, holders excused from them; the shard positions as of the last
    commit."""

    def __init__(self, shard_positions: Mapping[str, dict[str, int]] | None = None) -> None:
        self._reports: dict[tuple[int, int], dict[str, Done]] = {}
        self._excused: dict[tuple[int, int], set[str]] = {}
        self._arrived: dict[tuple[int, int], dict[str, float]] = {}
        """(Iteration, epoch) -> holder -> when its report came (the caller's clock)."""
        self._late: dict[tuple[int, int], set[str]] = {}
        """(Iteration, epoch) -> the holders excused from it for being late."""
        self._late_streak: dict[str, int] = {}
        """Holder -> the commits in a row, up to the last, that left it out for being late."""
        self.last_counted: frozenset[str] = frozenset()
        """The holders whose reports the last commit counted."""
        self.last_late: frozenset[str] = frozenset()
        """The holders the last commit left out for being late."""
        self.shard_positions: dict[str, dict[str, int]] = dict(shard_positions or {})
        """Shard index -> its data position after the last committed iteration (for handing it over)."""

    def add(self, sender: str, report: Done, *, own: Collection[str] | None = None, own_data: bool = False,
            now: float = 0.0) -> str | None:
        """Keep `sender`'s report (the newest per iteration, epoch and holder), which came at `now`; why not, if it
        is refused. With `own` (the shards its epoch gave it), a report that moves another holder's shard is refused;
        a holder with its own documents (`own_data`) moves no shard of the run, whatever it reports."""
        if own_data:
            report = replace(report, shards={})
        elif own is not None and not set(report.shards) <= set(own):
            foreign = sorted(set(report.shards) - set(own))
            return f"it reports shards {foreign[:5]}, which are not its own"
        self._reports.setdefault((report.iteration, report.epoch), {})[sender] = report
        self._arrived.setdefault((report.iteration, report.epoch), {}).setdefault(sender, now)
        return None

    def late(self, iteration: int, schedule: Schedule, left_out: Collection[str], started: float, now: float
             ) -> tuple[list[str], float]:
        """The holders of `iteration` under `schedule` still awaited at `now` that are late against those that
        reported (see the module docstring), and by how many seconds past the others' median; ([], 0) while none
        is. Only the reports of holders that inject microbatches are a yardstick (an idle one's comes at once: a
        full pipeline's holder outside its columns). One awaited that the last commit left out for being late gets
        `LATE_AGAIN_PATIENCE` times the margin, and one left out of the last `LATE_STREAK` commits is waited for.
        `started`: when the iteration began (its clock is the caller's, as `add`'s `now`)."""
        out = self._excused.get((iteration, schedule.epoch), set()) | set(left_out)
        counted = [p for p in schedule.data_holders if p not in out]
        injecting = injectors(schedule)
        arrived = {p: t for p, t in self._arrived.get((iteration, schedule.epoch), {}).items()
                   if p in counted and p in injecting}
        awaited = [p for p in counted if p not in self._arrived.get((iteration, schedule.epoch), {})]
        streak = max((self._late_streak.get(p, 0) for p in awaited), default=0)
        if streak >= LATE_STREAK:
            return [], 0.0
        patience = LATE_AGAIN_PATIENCE if streak else 1.0
        behind = overdue([max(0.0, t - started) for t in arrived.values()], len(awaited), now - started, patience)
        return (awaited, behind) if behind is not None else ([], 0.0)

    def excuse_late(self, iteration: int, epoch: int, holders: Collection[str], behind: float = 0.0) -> None:
        """`holders` were late against the others in `iteration` under `epoch` (`late`, `behind` seconds past
        their median report): it commits without them, and the next iteration is more patient with them."""
        logger.warning("iteration %d commits without %s: %.1f s behind the other holders' median report", iteration,
                       sorted(holders), behind, extra=event("holders_excused", iteration=iteration, epoch=epoch,
                                                            peers=sorted(holders), seconds=round(behind, 2)))
        self.excuse(iteration, epoch, holders)
        self._late.setdefault((iteration, epoch), set()).update(holders)

    def excuse(self, iteration: int, epoch: int, holders: Collection[str]) -> None:
        """`holders` were declared gone while `iteration` ran under `epoch`: it commits without them."""
        self._excused.setdefault((iteration, epoch), set()).update(holders)

    def try_commit(self, iteration: int, schedule: Schedule, left_out: Collection[str] = ()
                   ) -> tuple[Commit, list[Done]] | None:
        """The commit of `iteration` under `schedule` once each of its holders has reported it, with the reports
        counted; None while one is missing, or when no holder that injects microbatches is left to count (a commit
        without work would step on nothing and record a loss of 0). Holders in `left_out` (the epoch's
        peers declared gone or evicted) and those excused are neither waited for nor counted, and the commit names
        them (`Commit.left_out`): a holder among them that is alive puts its draws back. Reports of it and of
        earlier iterations are dropped once committed."""
        out = self._excused.get((iteration, schedule.epoch), set()) | set(left_out)
        counted = set(schedule.data_holders) - out
        reports = {p: r for p, r in self._reports.get((iteration, schedule.epoch), {}).items() if p in counted}
        if not counted & injectors(schedule) or not counted <= set(reports):
            return None
        for r in reports.values():
            self.shard_positions.update(r.shards)
        left_late = self._late.get((iteration, schedule.epoch), set())
        self._late_streak = {p: self._late_streak.get(p, 0) + 1 for p in left_late}
        self.last_counted, self.last_late = frozenset(reports), frozenset(left_late)
        self._reports = {k: v for k, v in self._reports.items() if k[0] > iteration}
        self._arrived = {k: v for k, v in self._arrived.items() if k[0] > iteration}
        self._excused = {k: v for k, v in self._excused.items() if k[0] > iteration}
        self._late = {k: v for k, v in self._late.items() if k[0] > iteration}
        return Commit(iteration=iteration, epoch=schedule.epoch, shards=dict(self.shard_positions),
                      left_out=tuple(sorted(p for p in out if p in schedule.placement))), list(reports.values())


def injectors(schedule: Schedule) -> set[str]:
    """The holders that inject microbatches under `schedule` (a full pipeline's holders outside its columns inject
    none: their reports come at once and carry no work)."""
    return {r.origin for r in schedule.routes}


def iteration_metrics(iteration: int, reports: list[Done], *, epoch: int, peers_online: int,
                      records: Mapping[str, PeerRecord], left_out: Collection[str] = ()) -> dict:
    """The swarm-wide line of one committed iteration (1-based `iteration` in the line): loss, tokens/s, the
    iteration's span from the first holder's start to the last holder's finish, the peers the commit left out
    (`Commit.left_out`: a holder among them was not counted) and the pooled message jitter the scheduled peers
    (`records`) measured lately."""
    losses = sum(r.losses for r in reports)
    seconds = max(r.finished for r in reports) - min(r.started for r in reports)
    tokens = sum(r.tokens for r in reports)
    record = {
        "iteration": iteration + 1,
        "loss": round(sum(r.loss_sum for r in reports) / max(1, losses), 6),
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
        "iteration_seconds": round(seconds, 4),
        "peers_online": peers_online,
        "epoch": epoch,
        "left_out": sorted(left_out),
        "time": round(time.time(), 3),
    }
    jitter = pooled_jitter([d for r in records.values() for d in r.jitter])
    if jitter is not None:  # the scheduled peers' latest measurements, pooled as the planner pools them
        record["jitter_ms"] = [round(1e3 * q, 2) for q in jitter_quantiles(jitter)]
    return record
