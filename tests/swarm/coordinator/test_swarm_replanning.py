"""The scheduler with `swarm.planner = "swarm"`: SWARM's own placement and wiring at the first plan; at each re-plan a
fresh draw, joiners sent to the bottleneck stage, and one peer moved from the least-loaded stage to the bottleneck
(an emptied stage refilled first); a stable swarm re-planned every few iterations."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.costs import CostTables
from scheduler.schedule import validate
from scheduler.swarm_balance import join_stage
from swarm.coordinator.epochs import EpochHistory
from swarm.coordinator.replanner import saved_plan_mismatch
from swarm.coordinator.scheduler import SWARM_REPLAN_ITERATIONS
from swarm.run_config import RunConfig
from tests.swarm.coordinator.conftest import STAGES, make_config, make_replanner, make_scheduler
from tests.swarm.coordinator.test_scheduler import commit, fresh, planned, published


def stage_array(schedule, ids):
    return np.array([schedule.placement.get(p, -1) for p in ids])


def test_the_first_plan_is_swarms_own_and_visits_every_stage(records):
    schedule = make_replanner("swarm").plan(records, epoch=0, start_iteration=0)
    validate(schedule)
    assert schedule.planner == "swarm" and set(schedule.placement) == set(records)
    assert {r.stages for r in schedule.routes} == {tuple(range(1, STAGES))}
    assert len(schedule.data_holders) == 2  # 12 peers on paths through all 6 stages: about one in six holds data
    assert schedule.meta["wiring"]["redrawn"] == "per epoch"
    assert saved_plan_mismatch(schedule, make_config("swarm")) is None
    assert "planner" in saved_plan_mismatch(schedule, make_config("full-pipeline"))


def test_a_joiner_goes_to_the_bottleneck_and_the_wiring_is_redrawn(records):
    joiner = "peer-11"
    r = make_replanner("swarm", rebalance=False)
    first = r.plan({p: rec for p, rec in records.items() if p != joiner}, epoch=0, start_iteration=0)
    ids = sorted(records)
    tables = CostTables.from_view(r.view(records), r.model_cost(records))
    expected = join_stage(tables, stage_array(first, ids), STAGES)
    again = r.replan(records, EpochHistory([first]), start_iteration=3, shard_positions={})
    validate(again, balance_tolerance=None)
    assert again.placement[joiner] == expected
    assert all(again.placement[p] == s for p, s in first.placement.items())  # no rebalancing asked: nobody moves
    assert again.meta["wiring"]["epoch"] == 1 and joiner in again.meta["joiners"]
    assert [r.peers for r in again.routes] != [r.peers for r in first.routes]


def test_a_stage_that_lost_every_peer_is_refilled_from_the_least_loaded(records):
    r = make_replanner("swarm", rebalance=False)
    first = r.plan(records, epoch=0, start_iteration=0)
    sizes = np.bincount(list(first.placement.values()), minlength=STAGES)
    emptied = next(st for st in range(1, STAGES) if sizes[st] <= 2)
    gone = [p for p, st in first.placement.items() if st == emptied]
    again = r.replan({p: rec for p, rec in records.items() if p not in gone}, EpochHistory([first]),
                     start_iteration=3, shard_positions={})
    validate(again, balance_tolerance=None)
    moved = [p for p in again.placement if again.placement[p] != first.placement[p]]
    assert len(moved) == 1 and again.placement[moved[0]] == emptied
    assert sizes[first.placement[moved[0]]] >= 2
    assert {r.stages for r in again.routes} == {tuple(range(1, STAGES))}  # every stage visited again
    assert moved[0] not in again.meta["handover"]  # nobody of its new stage is left to hand it over
    assert moved[0] in again.meta["restore"]  # it restarts the stage from a neighbour's blocks


def test_a_swarm_run_is_not_held_to_the_skip_ratio():
    config = RunConfig.from_tables({"swarm": {"planner": "swarm"}}, stages=2, skip=0.5)
    config.validate()
    assert config.planner == "swarm"
    with pytest.raises(ValueError, match="never train"):
        RunConfig.from_tables({"swarm": {"planner": "skippipe"}}, stages=2, skip=0.5).validate()


def test_a_stable_swarm_is_rewired_every_few_iterations_with_the_swarm_planner_only(records):
    for planner in ("swarm", "skippipe"):
        s = make_scheduler(planner)
        first = planned(s, records)
        commit(s, SWARM_REPLAN_ITERATIONS - 1)
        assert published(s.observe(fresh(records), 1.0)) == []
        commit(s, 1)
        actions = s.observe(fresh(records), 2.0)
        if planner == "skippipe":
            assert published(actions) == []
            continue
        (new,) = published(actions)
        assert new.epoch == 1 and new.meta["start_iteration"] == SWARM_REPLAN_ITERATIONS + 1
        assert new.meta["joiners"] == [] and new.meta["wiring"]["epoch"] == 1
        assert [r.peers for r in new.routes] != [r.peers for r in first.routes]
        assert published(s.observe(fresh(records), 3.0)) == []  # the new epoch has not run yet
        commit(s, SWARM_REPLAN_ITERATIONS + 1)
        (newer,) = published(s.observe(fresh(records), 4.0))
        assert newer.epoch == 2 and newer.meta["start_iteration"] == 2 * SWARM_REPLAN_ITERATIONS + 2
