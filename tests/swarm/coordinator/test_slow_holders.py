"""A late holder is judged slow only while its own passes are: one late for a slow relay's sake keeps its share."""

from __future__ import annotations

from swarm.control.messages import Done
from swarm.coordinator.slow_holders import SLOW_PACE, SlowHolders
from tests.swarm.coordinator.conftest import make_scheduler
from tests.swarm.coordinator.test_scheduler import planned


def done(holder: str, iteration: int, seconds_per_pass: float | None) -> Done:
    """`holder`'s report of 8 passes at `seconds_per_pass` each (None: a report that does not say)."""
    operations = 0 if seconds_per_pass is None else 8
    return Done(peer=holder, iteration=iteration, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=0.0,
                finished=1.0, operations=operations, compute=operations * (seconds_per_pass or 0.0))


def feed(slow: SlowHolders, newest, holders: list[str], late: str, pace: float | None, commits: int) -> list:
    """`commits` commits in a row: `late` counted in the first of every three, its passes at `pace` seconds each, and
    left out of the next two for being late; the others always counted, at 0.1 s a pass. What each commit changed."""
    changes = []
    for i in range(commits):
        counted = [h for h in holders if h != late or i % 3 == 0]
        for h in counted:
            slow.note(done(h, i, pace if h == late else 0.1))  # as the scheduler does with each report
        changes.append(slow.committed(newest, counted, [] if late in counted else [late]))
    return changes


def test_a_late_holder_whose_own_passes_are_slow_is_shared_down_and_one_as_quick_as_the_others_is_not(records):
    newest = planned(make_scheduler("skippipe"), records)
    holders = newest.data_holders
    quick = SlowHolders(per_shard=4)
    # late twice in three, but its passes are as quick as the others': a relay on its paths is slow, not it
    changes = feed(quick, newest, holders, holders[0], 0.12, 9)
    assert all(c == ({}, []) for c in changes) and quick.shares.share(holders[0]) == 1.0

    slow = SlowHolders(per_shard=4)
    changes = feed(slow, newest, holders, holders[0], 0.1 * SLOW_PACE, 9)  # its counted reports show slow passes
    assert [m[holders[0]].count for m, _ in changes if m] == [2, 1]
    assert [i for i, (_, off) in enumerate(changes) if off == [holders[0]]] == [8]  # then no share helps: benched


def test_a_holder_that_never_says_how_quick_its_passes_are_is_judged_on_lateness_alone(records):
    newest = planned(make_scheduler("skippipe"), records)
    holders = newest.data_holders
    slow = SlowHolders(per_shard=4)
    changes = feed(slow, newest, holders, holders[0], None, 3)
    assert [m[holders[0]].count for m, _ in changes if m] == [2]
    assert slow.slow_pace("unknown", holders) and not slow.slow_pace(holders[1], holders)


def test_a_late_holders_own_report_after_the_commit_counts_for_its_pace(records):
    """Its report of an iteration committed without it comes late, and says its passes were slow then: the late
    commits after it are held against it, without waiting for a counted one."""
    newest = planned(make_scheduler("skippipe"), records)
    holders = newest.data_holders
    slow, others = SlowHolders(per_shard=4), holders[1:]
    def commit(iteration: int, counted: list[str], late: list[str]):
        for h in counted:
            slow.note(done(h, iteration, 0.1))
        return slow.committed(newest, counted, late)

    commit(0, holders, [])  # all quick
    commit(1, others, [holders[0]])  # it turns slow: its passes were quick till now
    slow.note(done(holders[0], 1, 0.1 * SLOW_PACE))  # its late report of iteration 1
    assert commit(2, others, [holders[0]]) == ({}, [])
    moved, _ = commit(3, others, [holders[0]])
    assert moved[holders[0]].count == 2  # late twice since its passes showed slow
