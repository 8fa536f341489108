"""`rebase_start`: where a plan made while iterations committed starts, or that it must be made again."""

from __future__ import annotations

import dataclasses

from swarm.coordinator.epochs import EpochHistory
from swarm.coordinator.plan_job import PlanJob, rebase_start
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
