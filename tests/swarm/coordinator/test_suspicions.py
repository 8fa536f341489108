"""`Suspicions` on its own: a broken microbatch's witnesses count within one iteration, and a lone witness only
makes the scheduler ask the suspect (through the scheduler, see test_pings, test_reports and test_scheduler)."""

from __future__ import annotations

from swarm.control.messages import Broken, Ping
from swarm.coordinator.liveness import Liveness
from swarm.coordinator.suspicions import Suspicions
from tests.swarm.coordinator.conftest import make_replanner


def test_two_witnesses_of_one_iteration_convict_a_relay_and_a_commit_resets_the_count(records):
    schedule = make_replanner().plan(records, epoch=0, start_iteration=0)
    liveness = Liveness(2.0, exclude="coordinator")
    liveness.update({p: (r, 0.5) for p, r in records.items()}, 0.0)
    suspicions = Suspicions(liveness, 2.0)
    suspect, a, b, c = [p for p, st in schedule.placement.items() if st != 0][:4]

    def broken(reporter: str, iteration: int, in_progress: int, now: float) -> list:
        report = Broken(peer=reporter, iteration=iteration, epoch=0, microbatch=0, attempt=0, gone=suspect)
        return suspicions.broken(reporter, report, schedule, in_progress, now)

    (ask,) = broken(a, 0, 0, 1.0)
    assert isinstance(ask.message, Ping) and ask.message.peer == suspect and suspect not in liveness.declared_gone
    assert broken(b, 1, 0, 1.0) == []  # stale
    suspicions.committed()  # iteration 0 committed: its witness does not count towards iteration 1's
    suspicions.pong(suspect, ask.message.nonce, 1.5)  # alive: it answered
    liveness.update({p: (r, 0.5) for p, r in records.items()}, 19.5)  # its heartbeat is fresh, a's report old
    broken(b, 1, 1, 20.0)
    assert suspect not in liveness.declared_gone
    broken(c, 1, 1, 20.0)
    assert suspect in liveness.declared_gone  # two witnesses of one iteration, whatever its ping said before
