"""`Overtaking` on its own: the run has gone on without this scheduler once peers of its newest epoch, each in its
own name and more than half as many as its data holders, report iterations past the one it has in progress."""

from __future__ import annotations

from swarm.control.messages import Done
from swarm.coordinator.overtaking import Overtaking
from tests.swarm.coordinator.conftest import make_replanner


def done(peer: str, iteration: int) -> Done:
    return Done(peer=peer, iteration=iteration, epoch=0, loss_sum=1.0, losses=1, tokens=8, started=0.0, finished=1.0)


def test_most_holders_reporting_past_the_iteration_in_progress_overtake_it_and_nobody_alone_does(records):
    schedule = make_replanner().plan(records, epoch=0, start_iteration=0)
    holders, relay = schedule.data_holders, next(p for p, st in schedule.placement.items() if st > 0)
    assert len(holders) >= 3
    overtaking = Overtaking()
    # following this scheduler: the iteration in progress (7), or one before it
    assert not any(overtaking.note(h, done(h, 7), schedule, 7) for h in holders)
    assert not any(overtaking.note(h, done(h, 6), schedule, 7) for h in holders)
    # past it: one holder alone, a stranger, a report in another's name, an unknown epoch: none is the run moving on
    assert not overtaking.note(holders[0], done(holders[0], 30), schedule, 7)
    assert not overtaking.note("stranger", done("stranger", 9), schedule, 7)
    assert not overtaking.note(holders[1], done(holders[2], 9), schedule, 7)
    assert not overtaking.note(holders[1], done(holders[1], 9), None, 7)
    # as many as more than half of the holders past it, a relay moved to stage 0 among them: overtaken (a peer's
    # furthest report counts, not its last)
    ahead = [relay, *holders[1:len(holders) // 2]]
    results = [overtaking.note(p, done(p, 8), schedule, 7) for p in ahead]
    assert results[-1] and not any(results[:-1])
    assert overtaking.note(holders[0], done(holders[0], 7), schedule, 7)
    # a scheduler that has caught up is not
    assert not overtaking.note(holders[0], done(holders[0], 7), schedule, 31)
