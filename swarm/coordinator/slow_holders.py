"""`SlowHolders`: what the scheduler does about data holders slow for good, from the commits that left them out.

Each commit is fed to the holders' shares (`HolderShares`); what comes back is said in terms of the newest epoch: the
holders whose microbatch count changes (re-planned on the same placement) and those no share helps any more (taken
off the run's work for a while, `Benches`). Bookkeeping only: the scheduler announces and re-plans.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import NamedTuple

from scheduler.schedule import Schedule
from swarm.coordinator.benches import BENCH, Benches
from swarm.coordinator.holder_shares import OFF, HolderShares, holder_microbatches


class ShareChange(NamedTuple):
    """A holder's microbatches an iteration: `was` under the newest epoch, `count` at its new `share`."""

    was: int
    count: int
    share: float


class SlowHolders:
    """The holders' shares and benches of one run.

    :param per_shard: microbatches a holder injects per shard at its whole share (the run's `microbatches`)
    :param bench_seconds: a holder's first bench (the run's `swarm.bench_seconds`; 0: none is benched)
    """

    def __init__(self, per_shard: int, bench_seconds: float = BENCH) -> None:
        self.per_shard = per_shard
        self.shares = HolderShares()
        self.benches = Benches(bench_seconds)

    def committed(self, newest: Schedule, counted: Collection[str],
                  late: Collection[str]) -> tuple[dict[str, ShareChange], list[str]]:
        """A commit (one that lost no peer) counted `counted` and left out `late` for being late. The holders placed
        by `newest` whose microbatch count changes with it, and those to take off the run's work (late at their
        smallest share, or at one microbatch an iteration; none where benches are off: they stay there)."""
        before = self.shares.slowed
        single = [h for h, n in Counter(r.origin for r in newest.routes).items() if n == 1]
        changed = self.shares.committed(counted, late, single=single)
        shards = newest.meta.get("shards", {})

        def count(h: str, share: float) -> int:
            return holder_microbatches(self.per_shard, len(shards.get(h, ())), share)

        placed = {h: share for h, share in changed.items() if h in newest.placement}
        moved = {h: ShareChange(count(h, before.get(h, 1.0)), count(h, share), share)
                 for h, share in placed.items() if share != OFF}
        off = [h for h, s in placed.items() if s == OFF] if self.benches.enabled else []
        return {h: c for h, c in moved.items() if c.was != c.count}, off

    def bench(self, holder: str, now: float) -> float:
        """Take `holder` off the run's work from `now`: the seconds it sits out. Placed again, it starts afresh."""
        self.shares.forget([holder])
        return self.benches.bench(holder, now)

    def benched(self, now: float) -> set[str]:
        return self.benches.benched(now)

    def forget(self, holders: Collection[str]) -> None:
        """`holders` left the run (a bench stays: one restarted with its key is still too slow for now)."""
        self.shares.forget(holders)
