"""`HolderShares`: how much of its work each data holder is given, from how often commits left it out as late.

The planner plans on the speed a peer measured when it joined; a volunteer's machine can turn slower for good (a
job of its owner's, a throttled GPU). A holder late against the others is left out of the commit
(`CommitTracker.late`) and waited for every third iteration, so a holder much slower than the others holds the
whole swarm one iteration in three, and every other one commits without its draws. The commits tell a slow holder
from an unlucky one: one left out for being late in `SLOW_LATE` of its last `SLOW_WINDOW` counted-or-late
iterations gets half its share of microbatches (down to `MIN_SHARE`); the scheduler re-plans from the next iteration,
and the holder draws fewer samples of its shards per iteration (its shards move on slower; nothing is lost or drawn
twice). One on time for `RESTORE_AFTER` iterations in a row gets its share doubled back (up to all of it), and each
restore doubles the wait for the next: a holder slow for good is not re-planned back and forth. One still slow at
`MIN_SHARE`, or at one microbatch an iteration, is given none (`OFF`): its own part of the work and of its stage's
averaging are too slow for any share to help, and the scheduler takes it off the run for a while (`Benches`); it
starts afresh when placed again.

Pure bookkeeping: the scheduler feeds each commit (`committed`) and plans with `share`. It does not feed commits
that left a peer out for being gone: a holder whose microbatches went around a dead relay is late for the churn's
sake, not its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import Any

from swarm.constants import MAX_ID_CHARS

SLOW_WINDOW = 3
"""A holder's last iterations (those it was counted in or left out of for being late) its lateness is judged on."""
SLOW_LATE = 2
"""Iterations of the window a holder left out for being late in is slow (not one load spike: two in three)."""
MIN_SHARE = 0.25
"""The smallest share of its microbatches a holder is given (at least one microbatch whatever the share)."""
RESTORE_AFTER = 10
"""Iterations in a row a slowed holder must be on time in before its share is doubled back (the first time)."""
OFF = 0.0
"""The share of a holder still slow at `MIN_SHARE`: it is taken off the run's work (`swarm.coordinator.benches`)."""


class HolderShares:
    """Each data holder's share of its microbatches (1.0 unless slowed) and its recent lateness."""

    def __init__(self) -> None:
        self._share: dict[str, float] = {}
        self._recent: dict[str, deque[bool]] = {}
        """Holder -> whether it was left out for being late, in its last `SLOW_WINDOW` iterations."""
        self._on_time: dict[str, int] = {}
        """Holder -> the iterations in a row, up to the last, it was counted in."""
        self._restores: dict[str, int] = {}
        """Holder -> how many times its share was doubled back (each makes the next wait twice as long)."""

    def share(self, holder: str) -> float:
        """The share of its microbatches `holder` is given (1.0 unless the commits showed it slow)."""
        return self._share.get(holder, 1.0)

    @property
    def slowed(self) -> dict[str, float]:
        """The holders given less than all of their microbatches, with their shares."""
        return dict(self._share)

    def committed(self, counted: Collection[str], late: Collection[str], *,
                  single: Collection[str] = ()) -> dict[str, float]:
        """One commit counted the reports of `counted` and left out `late` for being late (holders left out for being
        gone are in neither); the holders of `single` inject one microbatch an iteration already (no smaller share
        gives them less). The holders whose share changes with it, with their new shares: `OFF` for one still slow
        at `MIN_SHARE` or in `single` (the caller takes it off the run and `forget`s it, or its share stays)."""
        changed: dict[str, float] = {}
        for holder in {*counted, *late}:
            was_late = holder in late
            recent = self._recent.setdefault(holder, deque(maxlen=SLOW_WINDOW))
            recent.append(was_late)
            self._on_time[holder] = 0 if was_late else self._on_time.get(holder, 0) + 1
            share = self.share(holder)
            if sum(recent) >= SLOW_LATE:
                changed[holder] = OFF if share <= MIN_SHARE or holder in single else max(MIN_SHARE, share / 2)
                recent.clear()  # judged afresh at its new share
            elif share < 1.0 and self._on_time[holder] >= RESTORE_AFTER * 2 ** self._restores.get(holder, 0):
                changed[holder] = min(1.0, share * 2)
                self._on_time[holder] = 0
                self._restores[holder] = self._restores.get(holder, 0) + 1
        for holder, share in changed.items():
            if share == OFF:
                continue  # its share stays until the caller takes it off the run (and forgets it)
            if share >= 1.0:
                self._share.pop(holder, None)
            else:
                self._share[holder] = share
        return changed

    def restore(self, saved: Any) -> list[str]:
        """Take over the shares a predecessor published (`slowed`, read from an epoch: checked, as anything read
        is); returns what was wrong with the entries dropped. Their lateness starts afresh."""
        if not isinstance(saved, dict):
            return [f"shares: a {type(saved).__name__}, not a map"] if saved is not None else []
        wrong = []
        for holder, share in saved.items():
            if not isinstance(holder, str) or not 0 < len(holder) <= MAX_ID_CHARS or \
                    type(share) not in (int, float) or not MIN_SHARE <= share < 1.0:
                wrong.append(f"share {str(holder)[:MAX_ID_CHARS]!r}: {str(share)[:40]}")
                continue
            self._share[holder] = float(share)
        return wrong

    def forget(self, holders: Collection[str]) -> None:
        """`holders` left the run: one that comes back starts afresh (a new process, maybe a new machine)."""
        for holder in holders:
            for table in (self._share, self._recent, self._on_time, self._restores):
                table.pop(holder, None)


def holder_microbatches(per_shard: int, shards: int, share: float) -> int:
    """Microbatches a holder of `shards` shards injects per iteration at `share` of its work: `per_shard` each
    (a holder with none injects one shard's worth), scaled by the share, at least one."""
    return max(1, round(per_shard * max(1, shards) * share))
