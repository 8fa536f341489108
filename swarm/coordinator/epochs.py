"""`EpochHistory`: the schedule epochs a scheduler has published, and which one runs a given iteration; and who
succeeds the scheduler under an epoch (`successors`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scheduler.schedule import Schedule


def successors(previous: Schedule | None, schedule: Schedule, first_seen: Callable[[str], float]) -> list[str]:
    """Who takes the scheduler's role over if it dies, under `schedule` (which follows `previous`), in order: the
    peers of the previous list still placed, then the others by how long they have been in the run (`first_seen`).
    Named in the signed schedule, so that a stranger cannot make itself successor (the smallest peer id, as it
    was, is a matter of grinding keys)."""
    before = previous.meta.get("successors", []) if previous is not None else []
    kept = [p for p in before if p in schedule.placement]
    rest = sorted((p for p in schedule.placement if p not in kept), key=lambda p: (first_seen(p), p))
    return kept + rest


class EpochHistory:
    """Every epoch published, oldest first. A new epoch starts at its `meta["start_iteration"]`; an epoch that
    starts at an iteration still in progress replaces the one running it (a rerun)."""

    def __init__(self, schedules: Iterable[Schedule] = ()) -> None:
        self.all: list[Schedule] = sorted(schedules, key=lambda s: s.epoch)

    def __bool__(self) -> bool:
        return bool(self.all)

    @property
    def latest(self) -> Schedule | None:
        """The newest epoch published (None before the first plan)."""
        return self.all[-1] if self.all else None

    def add(self, schedule: Schedule, *, in_progress: int | None = None) -> Schedule | None:
        """Count `schedule` as published; with iteration `in_progress` running, returns its `bridge`, to go along."""
        bridge = self.bridge(in_progress, schedule) if in_progress is not None else None
        self.all.append(schedule)
        return bridge

    def withdraw(self, schedule: Schedule) -> None:
        """Forget `schedule` again (it could not be published)."""
        if self.all and self.all[-1] is schedule:
            self.all.pop()

    def get(self, epoch: int) -> Schedule | None:
        """Epoch `epoch` (None if it is not one of these)."""
        return next((s for s in self.all if s.epoch == epoch), None)

    def in_force(self, iteration: int) -> Schedule:
        """The epoch that runs `iteration`: the newest one starting at or before it (a successor that knows only
        later epochs takes its oldest)."""
        started = [s for s in self.all if int(s.meta.get("start_iteration", 0)) <= iteration]
        return max(started, key=lambda s: s.epoch) if started else self.all[0]

    def bridge(self, iteration: int, schedule: Schedule) -> Schedule | None:
        """The epoch to publish along with `schedule` (see `ScheduleMsg.bridge`), `iteration` being in progress: the
        one in force for it, if it started at that very iteration (some peers may not have read it yet) and
        `schedule` starts later (it would replace that epoch in the DHT before they do)."""
        if not self.all:
            return None
        running = self.in_force(iteration)
        starts = int(running.meta.get("start_iteration", 0))
        return running if starts == iteration < int(schedule.meta.get("start_iteration", 0)) else None

    def ever_held(self, peer: str) -> bool:
        """Whether `peer` was a data holder in any epoch (whose reports may still come in)."""
        return any(peer in s.data_holders for s in self.all)

    def shards_of(self, peer: str, epoch: int) -> set[str]:
        """The data shards (indices as strings) epoch `epoch` gave holder `peer` (none if it knows no such epoch)."""
        s = self.get(epoch)
        if s is None:
            return set()
        specs = s.meta.get("shards", {}).get(peer)
        if specs is None:
            specs = [s.data_holders.index(peer)] if peer in s.data_holders else []
        return {str(int(k)) for k in specs}
