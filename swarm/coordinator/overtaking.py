"""`Overtaking`: whether the run went on under another scheduler while this one was away.

A coordinator frozen or cut off past its record's lifetime is succeeded: the first live successor its newest signed
epoch names takes the role and commits on. Thawed, the coordinator is behind: the peers do not follow it again (its
beats are no news to them, `ScheduleFollower`), and if it went on planning it would compete with its successor,
re-planning on what it missed and publishing epochs the peers might take for news. So it stands down once it sees
that the run has moved on without it: peers of its newest epoch, as many as more than half of that epoch's data
holders, reported iterations past the one it has in progress (peers, not only its holders: the successor may have
moved a relay to stage 0). A holder reports an iteration only once the scheduler it follows has committed the one
before, so none following this scheduler does; and each report is signed by its holder, so no single peer can fake
the move (a lone commit from a successor could be a hostile successor's, standing the coordinator down to take the
run over).
"""

from __future__ import annotations

from scheduler.schedule import Schedule
from swarm.control.messages import Done


class Overtaking:
    """The peers seen reporting past this scheduler's iteration in progress."""

    def __init__(self) -> None:
        self._furthest: dict[str, int] = {}
        """Peer of the newest epoch -> the furthest iteration it reported."""

    def note(self, sender: str, report: Done, schedule: Schedule | None, completed: int) -> bool:
        """`sender`'s `done`, this scheduler's newest epoch being `schedule` and its iteration in progress
        `completed`: True once peers of `schedule`, more than half as many as its data holders, reported iterations
        past `completed`. A report in another peer's name, or from a peer `schedule` does not place, counts for
        nothing."""
        if schedule is None or report.peer != sender or sender not in schedule.placement:
            return False
        self._furthest[sender] = max(report.iteration, self._furthest.get(sender, report.iteration))
        ahead = [p for p in schedule.placement if self._furthest.get(p, -1) > completed]
        return 2 * len(ahead) > len(schedule.data_holders)
