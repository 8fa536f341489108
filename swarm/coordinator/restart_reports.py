"""`RestartReports`: when the peers' reports that an iteration cannot finish are believed, and a rerun is started.

A 'stuck' or 'unrecoverable' report makes the scheduler abandon the iteration in progress and run it again under a
new epoch. Believed blindly, one peer could report every iteration and none would ever complete (50 reports, 50
restarts). So a report counts only when it is corroborated: by a second scheduled peer reporting the same
iteration and epoch, or by the scheduler's own clock, when the iteration has been running for much longer than
iterations take. A peer whose lone report was believed is not believed alone again for a few committed iterations.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from scheduler.schedule import Schedule
from swarm.control.messages import Stuck, Unrecoverable

logger = logging.getLogger(__name__)

STUCK_FACTOR = 3.0
"""A lone report is believed once the iteration has run this many times the last iteration's duration..."""
MIN_STUCK_SECONDS = 10.0
"""...and at least this many seconds (iterations of the tiny model take well under a second)."""
LONE_REPORT_COOLDOWN = 5
"""Committed iterations before a peer's lone report is believed again."""


@dataclass
class RestartReports:
    """The reports of the iteration in progress and the scheduler's clock of it. `now` is monotonic seconds."""

    progress_at: float = 0.0
    """When the iteration in progress became the one in progress (the last commit, or a (re)start)."""
    iteration_seconds: float = 0.0
    """How long the last committed iteration took."""
    period: float = 0.0
    """Seconds between the last two commits (0 until there were two): when the next one is due."""
    _reporters: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    _lone_at: dict[str, int] = field(default_factory=dict)
    """Peer -> the iteration whose restart its lone report caused."""
    _restarted: set[tuple[int, int]] = field(default_factory=set)
    """The (iteration, epoch) pairs run again: each is, once."""

    def judge(self, reporter: str, report: Stuck | Unrecoverable, running: Schedule, live: Collection[str],
              now: float) -> str | None:
        """Why the iteration `reporter` reports unable to finish runs again (`running` running it, `live` the live
        peers; said in the log), or None: the reporter is not of that epoch, the iteration already ran again under
        it, or the report is not believed yet (a peer of the epoch gone corroborates it, else `believed`)."""
        key = (report.iteration, report.epoch)
        if reporter not in running.placement or report.epoch != running.epoch or key in self._restarted:
            return None
        dead = sorted(p for p in running.placement if p not in live)
        why = f"{dead[0]} of its epoch is gone" if dead else self.believed(reporter, *key, now)
        if why is None:
            logger.info("iteration %d reported %s by %s alone, too early to believe", report.iteration,
                        type(report).__name__.lower(), reporter)
            return None
        logger.warning("iteration %d is %s at %s under epoch %d (%s): running it again under a new epoch",
                       report.iteration, "stuck" if isinstance(report, Stuck) else "unrecoverable", reporter,
                       report.epoch, why)
        self.restarting(*key, now)
        return why

    def restarting(self, iteration: int, epoch: int, now: float) -> None:
        """`iteration`, run under `epoch`, runs again from now."""
        self._restarted.add((iteration, epoch))
        self.progress(now)

    def progress(self, now: float, iteration_seconds: float | None = None) -> None:
        """An iteration was committed (with its duration), or one was (re)started: its clock starts now."""
        if iteration_seconds is not None:
            self.iteration_seconds = iteration_seconds
            self.period = now - self.progress_at if self.progress_at else 0.0
        self.progress_at = now
        self._reporters.clear()

    def due_in(self, now: float) -> float | None:
        """Seconds until the iteration in progress is due to commit, as long after its start as the last commit came
        after the one before (None before two commits; 0 once it is due)."""
        return max(0.0, self.period - (now - self.progress_at)) if self.period else None

    def reported(self, iteration: int, epoch: int) -> bool:
        """Whether a scheduled peer reported (iteration, epoch) unable to finish, believed or not yet."""
        return bool(self._reporters.get((iteration, epoch)))

    def believed(self, reporter: str, iteration: int, epoch: int, now: float) -> str | None:
        """Why `reporter`'s report about (iteration, epoch) is believed, or None while it is not (yet)."""
        reporters = self._reporters.setdefault((iteration, epoch), set())
        reporters.add(reporter)
        if len(reporters) >= 2:
            return f"reported by {len(reporters)} peers"
        overdue = max(MIN_STUCK_SECONDS, STUCK_FACTOR * self.iteration_seconds)
        running = now - self.progress_at
        last = self._lone_at.get(reporter)
        if running >= overdue and (last is None or iteration - last >= LONE_REPORT_COOLDOWN):
            self._lone_at[reporter] = iteration
            return f"running for {running:.0f} s, more than {overdue:.0f} s"
        return None
