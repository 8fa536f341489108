"""`Suspicions` on its own: a broken microbatch's witnesses count within one iteration, and a lone witness only
makes the scheduler ask the suspect (through the scheduler, see test_pings, test_reports and test_scheduler)."""

from __future__ import annotations

from swarm.control.messages import Broken, Ping
from swarm.coordinator.epochs import EpochHistory
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
        return suspicions.broken(reporter, report, EpochHistory([schedule]), in_progress, now)

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


def test_a_report_counts_under_its_own_epoch_and_against_a_suspect_the_newest_epoch_still_places(records):
    """Epoch 0 runs iteration 0; epoch 1, published meanwhile for iteration 1, leaves the reporter out; epoch 2
    leaves the suspect out as well."""
    replanner = make_replanner()
    first = replanner.plan(records, epoch=0, start_iteration=0)
    suspect, reporter, other = [p for p, st in first.placement.items() if st != 0][:3]
    second = replanner.plan({p: r for p, r in records.items() if p != reporter}, epoch=1, start_iteration=1)
    third = replanner.plan({p: r for p, r in records.items() if p not in (reporter, suspect)}, epoch=2,
                           start_iteration=1)
    assert suspect in second.placement and reporter not in second.placement and suspect not in third.placement

    def broken(epochs: list, sender: str, epoch: int) -> list:
        liveness = Liveness(2.0, exclude="coordinator")
        liveness.update({p: (r, 0.5) for p, r in records.items()}, 0.0)
        report = Broken(peer=sender, iteration=0, epoch=epoch, microbatch=0, attempt=0, gone=suspect)
        return Suspicions(liveness, 2.0).broken(sender, report, EpochHistory(epochs), 0, 1.0)

    # the epoch running the iteration places the reporter: its word counts, though the newest leaves it out
    (ask,) = broken([first, second], reporter, 0)
    assert isinstance(ask.message, Ping) and ask.message.peer == suspect
    assert broken([first, second], reporter, 1) == []  # not placed in the epoch its report names
    assert broken([first, second], other, 1) != []  # the newest epoch's word counts too
    assert broken([first], reporter, 5) == []  # an epoch the scheduler does not know
    # an epoch neither running the iteration nor the newest: superseded before it ran
    fourth = replanner.plan(records, epoch=3, start_iteration=1)
    assert broken([first, second, fourth], other, 1) == [] and broken([first, second, fourth], other, 3) != []
    # the newest epoch plans without the suspect already: nothing to say of it
    assert broken([first, second, third], reporter, 0) == []
    assert broken([first, second, third], other, 2) == []
