"""`SlowHolders`: what the scheduler does about data holders slow for good, from the commits that left them out.

Each commit is fed to the holders' shares (`HolderShares`); what comes back is said in terms of the newest epoch: the
holders whose microbatch count changes (re-planned on the same placement) and those no share helps any more (taken
off the run's work for a while, `Benches`). Bookkeeping only: the scheduler announces and re-plans.

A holder is late when its microbatches come back late, which a slow relay on their paths causes as surely as a slow
holder. The commits alone cannot tell the two apart, so a holder's lateness counts against it only while its own passes
are slow: each `done` says how many forward and backward passes the holder computed and in how many seconds, and a late
holder whose last report shows them `SLOW_PACE` times slower than the other holders' (median) is judged (a late
holder's report of the iteration it was left out of comes after that commit, and counts too); one as quick as the
others is late for someone else's sake, and that commit is not fed for it (nor for one that never said, judged on
lateness alone as before). Passes of one stage cost the same on every holder (stage 0, one microbatch shape), so
seconds per pass compare.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from collections.abc import Collection, Mapping
from typing import NamedTuple

from scheduler.schedule import Schedule
from swarm.control.messages import Done
from swarm.coordinator.holder_shares import OFF, HolderShares, holder_microbatches
from swarm.events import event

logger = logging.getLogger(__name__)

SLOW_PACE = 2.0
"""How many times the other holders' median seconds per pass a late holder's own must take for its lateness to be its
own (a throttled or busy machine shows 10x and more; one holder's passes vary by tens of percent under load)."""


class ShareChange(NamedTuple):
    """A holder's microbatches an iteration: `was` under the newest epoch, `count` at its new `share`."""

    was: int
    count: int
    share: float


def log_share_changes(moved: Mapping[str, ShareChange], start: int) -> None:
    """Say, for the log and the run's events, which holders inject how many microbatches from iteration `start`."""
    for h, c in moved.items():
        logger.warning("%s %s: it injects %d microbatches instead of %d from iteration %d", h,
                       "was left out of commits for being late" if c.count < c.was else "has been on time again",
                       c.count, c.was, start, extra=event("holder_share", peer=h, share=c.share, microbatches=c.count,
                                                          was=c.was, start_iteration=start))


class SlowHolders:
    """The holders' shares in one run, and the holders no share helps.

    :param per_shard: microbatches a holder injects per shard at its whole share (the run's `microbatches`)
    :param benching: whether a holder no share helps is taken off the run's work (the run's `swarm.bench_seconds`
      is not 0), else it stays at its smallest share
    """

    def __init__(self, per_shard: int, benching: bool = True) -> None:
        self.per_shard = per_shard
        self.benching = benching
        self.shares = HolderShares()
        self._pace: dict[str, float] = {}
        """Holder -> seconds per pass in its last report that said (`note`)."""

    def committed(self, newest: Schedule, counted: Collection[str],
                  late: Collection[str]) -> tuple[dict[str, ShareChange], list[str]]:
        """A commit (one that lost no peer) counted `counted` and left out `late` for being late (their reports were
        `note`d as they came). The holders placed by `newest` whose microbatch count changes with it, and those to
        take off the run's work (late at their smallest share, or at one microbatch an iteration; none where benches
        are off)."""
        own = [h for h in late if self.slow_pace(h, counted)]
        before = self.shares.slowed
        single = [h for h, n in Counter(r.origin for r in newest.routes).items() if n == 1]
        changed = self.shares.committed(counted, own, single=single)
        shards = newest.meta.get("shards", {})

        def count(h: str, share: float) -> int:
            return holder_microbatches(self.per_shard, len(shards.get(h, ())), share)

        placed = {h: share for h, share in changed.items() if h in newest.placement}
        moved = {h: ShareChange(count(h, before.get(h, 1.0)), count(h, share), share)
                 for h, share in placed.items() if share != OFF}
        off = [h for h, s in placed.items() if s == OFF] if self.benching else []
        return {h: c for h, c in moved.items() if c.was != c.count}, off

    def note(self, report: Done) -> None:
        """A holder's `done`, counted or not: a late holder's report comes after the commit that left it out, and
        says how slow its passes were then (sooner than its next counted one)."""
        if report.operations > 0:
            self._pace[report.peer] = report.compute / report.operations

    def slow_pace(self, holder: str, others: Collection[str]) -> bool:
        """Whether `holder`'s own passes are `SLOW_PACE` times slower than the median of `others`' (True where it or
        they never said: lateness alone judges then)."""
        mine = self._pace.get(holder)
        theirs = [self._pace[p] for p in others if p != holder and p in self._pace]
        return mine is None or not theirs or mine >= SLOW_PACE * statistics.median(theirs)

    def forget(self, holders: Collection[str]) -> None:
        """`holders` left the run or were benched: placed again, each starts afresh at its whole share."""
        self.shares.forget(holders)
        for h in holders:
            self._pace.pop(h, None)
