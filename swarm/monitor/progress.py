"""`ProgressLog`: the per-iteration progress of a run, rebuilt from the gossip an onlooker overhears.

Data holders gossip a `Done` for each iteration they finish, and the scheduler a `Commit` once all of an epoch's
holders have. The log keeps the `Done`s of scheduled holders only (anyone may gossip), and turns each commit into the
same line the coordinator writes to its metrics file (`iteration_metrics`), plus the iteration the schedule planned.
Memory is bounded: at most `keep` committed lines and `MAX_PENDING` iterations awaiting their commit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection

from swarm.control.messages import Commit, Done
from swarm.coordinator.commit_tracker import iteration_metrics

MAX_PENDING = 64
"""Iterations whose reports are held while their commit has not been heard; older ones are dropped first."""


class ProgressLog:
    """Committed iterations, oldest first, as metrics lines (`iteration` 1-based, as in `metrics.jsonl`)."""

    def __init__(self, keep: int = 500) -> None:
        self.lines: deque[dict] = deque(maxlen=keep)
        self._reports: dict[tuple[int, int], dict[str, Done]] = {}
        self._committed: set[tuple[int, int]] = set()

    def add_done(self, sender: str, done: Done, holders: Collection[str]) -> bool:
        """Keep `sender`'s report if it is one of the epoch's data `holders` reporting as itself; True if kept."""
        if sender != done.peer or sender not in holders or (done.iteration, done.epoch) in self._committed:
            return False
        self._reports.setdefault((done.iteration, done.epoch), {})[sender] = done
        while len(self._reports) > MAX_PENDING:
            del self._reports[min(self._reports)]
        return True

    def add_commit(self, commit: Commit, *, peers_online: int, planned_seconds: float | None) -> dict | None:
        """The line of a committed iteration, from the reports heard for it (None if none was heard)."""
        key = (commit.iteration, commit.epoch)
        reports = self._reports.pop(key, {})
        if not reports or key in self._committed:
            return None
        self._committed.add(key)
        if len(self._committed) > 4 * MAX_PENDING:
            self._committed = {k for k in self._committed if k[0] > commit.iteration - MAX_PENDING}
        line = iteration_metrics(commit.iteration, list(reports.values()), epoch=commit.epoch,
                                 peers_online=peers_online, records={})
        line["planned_seconds"] = None if planned_seconds is None else round(planned_seconds, 4)
        line["holders_heard"] = len(reports)
        self.lines.append(line)
        return line
