"""A stage that lost every peer: paths skip it (R lowered only when nothing else fits), the baselines run
without it, the schedule says so on the wire, and the next joiner is placed there."""

import numpy as np
import pytest

from scheduler.costs import CostTables
from scheduler.path_rules import PathRules, path_violation, rules_around, valid_stage_sequences
from scheduler.placement import PlacementGoal, place_joining
from scheduler.planner import PlanOptions, baseline_schedule, default_model, plan_tables
from scheduler.profiles import preset
from scheduler.schedule import Schedule, ScheduleError, validate


def test_paths_avoid_an_unserved_stage_and_r_is_lowered_only_when_needed():
    rules, relaxed = rules_around(PathRules(6, 4), {3})
    assert not relaxed and rules.stages_per_path == 4 and rules.unserved == {3}
    assert valid_stage_sequences(rules) and all(3 not in seq for seq in valid_stage_sequences(rules))
    assert "stage 3 has no peer" in path_violation((1, 3, 4), rules)
    full, relaxed = rules_around(PathRules(4, 4, max_swaps=0), {2})
    assert relaxed and full.stages_per_path == 3 and valid_stage_sequences(full) == ((1, 3),)
    with pytest.raises(ValueError, match="cannot be met"):
        PathRules(4, 4, unserved=frozenset({2}))
    with pytest.raises(ValueError, match="non-zero stages"):
        PathRules(4, 3, unserved=frozenset({0}))


def placement_without_stage(stage: int, n: int = 12, stages: int = 6) -> tuple[CostTables, np.ndarray]:
    tables = CostTables.from_view(preset("geo-distributed", n), default_model(stages))
    stage_of = np.array([i % stages for i in range(n)])
    stage_of[stage_of == stage] = (stage % (stages - 1)) + 1  # its peers went elsewhere: the stage is empty
    return tables, stage_of


def test_planning_and_baselines_run_without_the_empty_stage():
    tables, stage_of = placement_without_stage(2)
    rules, _ = rules_around(PathRules.from_skip_ratio(6, 0.33), {2})
    schedule = plan_tables(tables, rules, PlanOptions(microbatches_per_holder=3, iterations=50), stage_of=stage_of)
    validate(schedule)  # balanced over the served stages
    assert all(2 not in r.stages for r in schedule.routes) and np.isfinite(schedule.predicted_iteration_seconds)
    for method in ("full_pipeline", "random_skip"):
        baseline = baseline_schedule(schedule, tables, method, tune=True)
        validate(baseline, balance_tolerance=None)
        assert all(2 not in r.stages for r in baseline.routes)
    full = baseline_schedule(schedule, tables, "full_pipeline")
    assert {r.stages for r in full.routes} == {(1, 3, 4, 5)}
    again = Schedule.from_dict(schedule.to_dict())
    assert again.rules.unserved == {2} and again == schedule


def test_a_schedule_naming_a_bad_unserved_stage_is_refused():
    tables, stage_of = placement_without_stage(2)
    rules, _ = rules_around(PathRules.from_skip_ratio(6, 0.33), {2})
    d = plan_tables(tables, rules, PlanOptions(microbatches_per_holder=2, iterations=0), stage_of=stage_of).to_dict()
    for bad, match in ((["x"], "unserved"), ([0], "unserved"), ("2", "unserved"), (list(range(1, 400)), "limit")):
        d["rules"]["unserved"] = bad
        with pytest.raises(ScheduleError, match=match):
            Schedule.from_dict(d)


def test_a_joiner_takes_over_the_empty_stage():
    tables, stage_of = placement_without_stage(4, n=13)
    stage_of[12] = -1
    goal = PlacementGoal(rules=PathRules(6, 4), microbatches_per_holder=3)
    assert place_joining(tables, stage_of, 12, goal)[12] == 4
