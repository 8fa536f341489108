"""`rebase_start`: where a plan made while iterations committed starts, or that it must be made again; a plan
across an epoch that came into force meanwhile is moved to its new start where it reckons alike against that epoch
(`reckoned_alike`)."""

from __future__ import annotations

import dataclasses

from swarm.coordinator.epochs import EpochHistory
from swarm.coordinator.plan_job import PlanJob, rebase_start
from swarm.coordinator.reckoning import reckoned_alike
from tests.swarm.coordinator.conftest import make_replanner


def epochs(records) -> EpochHistory:
    """Epoch 0 from iteration 0, epoch 1 from iteration 3."""
    first = make_replanner().plan(records, epoch=0, start_iteration=0)
    return EpochHistory([first, dataclasses.replace(first, epoch=1, meta={**first.meta, "start_iteration": 3})])


def job(history: EpochHistory, *, start: int, asked_at: int) -> PlanJob:
    return PlanJob(why="membership", peers={}, records={}, start=start, asked_at=asked_at, history=history,
                   shard_positions={})


def test_a_plan_starts_where_asked_unless_iterations_committed_then_at_the_next_one(records):
    history = epochs(records)
    ahead = job(history, start=4, asked_at=3)  # from the next iteration
    assert rebase_start(ahead, 3, history) == 4
    assert rebase_start(ahead, 5, history) == 6  # 3 and 4 committed meanwhile: 5 goes on under epoch 1
    rerun = job(history, start=3, asked_at=3)  # the iteration in progress again
    assert rebase_start(rerun, 3, history) == 3


def test_a_plan_is_made_again_when_the_epoch_it_follows_or_starts_after_changed(records):
    history = epochs(records)
    # a rerun of iteration 3 follows epoch 0's iteration 2; iteration 3 committed after all, and 4 runs under epoch
    # 1: its joiners and hand-overs were reckoned against epoch 0
    assert rebase_start(job(history, start=3, asked_at=3), 4, history) is None
    newer = EpochHistory([*history.all, dataclasses.replace(history.latest, epoch=2)])
    assert rebase_start(job(history, start=4, asked_at=3), 3, newer) is None


def made_across(records, first_gone: str, then_gone: str) -> tuple[PlanJob, EpochHistory]:
    """Epoch 0 of `records`; epoch 1 without `first_gone` from iteration 3; a plan without `then_gone` too, asked with
    iteration 2 in progress (so from iteration 3, replacing epoch 1 before it starts) and made."""
    replanner = make_replanner()
    first = replanner.plan(records, epoch=0, start_iteration=0)
    live = {p: r for p, r in records.items() if p != first_gone}
    history = EpochHistory([first, replanner.replan(live, EpochHistory([first]), start_iteration=3,
                                                    shard_positions={})])
    live = {p: r for p, r in live.items() if p != then_gone}
    made = PlanJob(why="membership", peers=live, records=live, start=3, asked_at=2, history=history,
                   shard_positions={})
    made.run(replanner)
    return made, history


def test_a_plan_across_an_epoch_that_came_into_force_moves_to_the_next_iteration_where_it_reckons_alike(records):
    # iteration 2 committed while the plan was made: epoch 1 runs iteration 3, and the plan starts at 4. It was
    # reckoned against epoch 0; epoch 1 only dropped a relay (no move, no joiner): it reckons alike, and stands
    made, history = made_across(records, "peer-02", "peer-10")
    assert history.latest.meta["handover"] == {} and made.outcome.meta["joiners"] == []
    assert rebase_start(made, 3, history) == 4


def test_a_plan_across_an_epoch_whose_move_it_carried_or_whose_dropped_peer_it_placed_is_made_again(records):
    # epoch 1 moved peer-08 to stage 3 (its state handed over from peer-05): the plan, reckoned against epoch 0,
    # carries that move, which epoch 1 in force has made already
    made, history = made_across(records, "peer-00", "peer-10")
    assert history.latest.meta["handover"] == {"peer-08": "peer-05"}
    assert rebase_start(made, 3, history) is None
    # a plan that places again, on its old stage, a peer epoch 1 dropped: a veteran against epoch 0, a joiner
    # against epoch 1 (it missed iteration 3's step)
    made, history = made_across(records, "peer-02", "peer-10")
    back = dataclasses.replace(made.outcome, placement={**made.outcome.placement, "peer-02": 2})
    before, now_before = history.in_force(2), history.in_force(3)
    assert reckoned_alike(made.outcome, history.latest, before, now_before, made.records, frozenset())
    assert not reckoned_alike(back, history.latest, before, now_before, made.records, frozenset())
