"""`CommitTracker`: the data holders' `done` reports, turned into commits of whole iterations.

An iteration is committed once every data holder of the epoch running it has reported it done under that epoch,
but those left out of it: a holder declared gone during the iteration is excused (the others' work is committed
without its draws, which the holder that takes its shard over draws again), and so is one declared gone or evicted
before its report came (its report is not counted). Only then do the peers average and step. The commit carries
every shard's position after it, so a shard that changes holder starts where the last commit left it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import replace

from scheduler.costs import jitter_quantiles, pooled_jitter
from scheduler.schedule import Schedule
from swarm.control.messages import Commit, Done
from swarm.wire import PeerRecord


class CommitTracker:
    """Reports by (iteration, epoch) and reporter, holders excused from them; the shard positions as of the last
    commit."""

    def __init__(self, shard_positions: Mapping[str, dict[str, int]] | None = None) -> None:
        self._reports: dict[tuple[int, int], dict[str, Done]] = {}
        self._excused: dict[tuple[int, int], set[str]] = {}
        self.shard_positions: dict[str, dict[str, int]] = dict(shard_positions or {})
        """Shard index -> its data position after the last committed iteration (for handing it over)."""

    def add(self, sender: str, report: Done, *, own: Collection[str] | None = None, own_data: bool = False
            ) -> str | None:
        """Keep `sender`'s report (the newest per iteration, epoch and holder); why not, if it is refused. With
        `own` (the shards its epoch gave it), a report that moves another holder's shard is refused; a holder with
        its own documents (`own_data`) moves no shard of the run, whatever it reports."""
        if own_data:
            report = replace(report, shards={})
        elif own is not None and not set(report.shards) <= set(own):
            foreign = sorted(set(report.shards) - set(own))
            return f"it reports shards {foreign[:5]}, which are not its own"
        self._reports.setdefault((report.iteration, report.epoch), {})[sender] = report
        return None

    def excuse(self, iteration: int, epoch: int, holders: Collection[str]) -> None:
        """`holders` were declared gone while `iteration` ran under `epoch`: it commits without them."""
        self._excused.setdefault((iteration, epoch), set()).update(holders)

    def try_commit(self, iteration: int, schedule: Schedule, left_out: Collection[str] = ()
                   ) -> tuple[Commit, list[Done]] | None:
        """The commit of `iteration` under `schedule` once each of its holders has reported it, with the reports
        counted; None while one is missing, or when no holder is left to count. Holders in `left_out` (the epoch's
        peers declared gone or evicted) and those excused are neither waited for nor counted, and the commit names
        them (`Commit.left_out`): a holder among them that is alive puts its draws back. Reports of it and of
        earlier iterations are dropped once committed."""
        out = self._excused.get((iteration, schedule.epoch), set()) | set(left_out)
        counted = set(schedule.data_holders) - out
        reports = {p: r for p, r in self._reports.get((iteration, schedule.epoch), {}).items() if p in counted}
        if not counted or not counted <= set(reports):
            return None
        for r in reports.values():
            self.shard_positions.update(r.shards)
        self._reports = {k: v for k, v in self._reports.items() if k[0] > iteration}
        self._excused = {k: v for k, v in self._excused.items() if k[0] > iteration}
        return Commit(iteration=iteration, epoch=schedule.epoch, shards=dict(self.shard_positions),
                      left_out=tuple(sorted(p for p in out if p in schedule.placement))), list(reports.values())


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
