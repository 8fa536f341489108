import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.baselines import full_pipeline, random_skip
from scheduler.costs import CostTables
from scheduler.path_rules import PathRules, path_violation
from scheduler.paths import PathProblem, evaluate, plan_paths, stage_budget, to_sim_routes
from scheduler.placement import stage_sizes
from scheduler.simulator import simulate
from tests.scheduler.conftest import stage_array


def reference_problem(reference, rules=PathRules(6, 4)):
    return PathProblem(reference.tables, stage_array(reference), reference.data_holders, (6,) * 5, rules)


def test_reference_instance_no_worse_than_reference_paths(reference):
    plan = plan_paths(reference_problem(reference), seed=0)
    assert plan.makespan <= 33.31379002209655 + 1e-9  # the reference SkipPipe paths
    full = simulate(reference.tables, to_sim_routes(full_pipeline(reference_problem(reference, PathRules(6, 6)))))
    assert plan.makespan <= 0.45 * full.makespan


def test_plan_is_deterministic_for_a_seed(reference):
    a = plan_paths(reference_problem(reference), seed=3, iterations=150)
    b = plan_paths(reference_problem(reference), seed=3, iterations=150)
    assert [(r.origin, r.stages, r.nodes, r.inject_at) for r in a.routes] == \
           [(r.origin, r.stages, r.nodes, r.inject_at) for r in b.routes]


def test_skip_zero_gives_the_full_pipeline(reference):
    plan = plan_paths(reference_problem(reference, PathRules(6, 6)), iterations=50)
    assert all(r.stages == (1, 2, 3, 4, 5) for r in plan.routes)


def random_problem(seed: int, peers: int, stages: int, rpath: int, memory: int, mb: int) -> PathProblem:
    rng = np.random.default_rng(seed)
    rules = PathRules(stages, rpath)
    sizes = stage_sizes(peers, rules)
    stage_of = np.repeat(np.arange(stages), sizes)
    rng.shuffle(stage_of)
    forward = rng.uniform(0.1, 0.4, peers)[:, None] * np.ones((1, stages))
    msg = rng.uniform(0.05, 2.0, (peers, peers))
    np.fill_diagonal(msg, 0)
    tables = CostTables(ids=tuple(f"p{i}" for i in range(peers)), forward=forward, message=msg,
                        memory=np.full(peers, memory))
    holders = tuple(int(v) for v in np.flatnonzero(stage_of == 0))
    return PathProblem(tables, stage_of, holders, (mb,) * len(holders), rules)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), peers=st.integers(6, 24), stages=st.integers(3, 7),
       skip=st.sampled_from([0.0, 0.25, 0.34, 0.5]), memory=st.integers(1, 4), mb=st.integers(1, 6))
def test_planned_paths_obey_every_rule(seed, peers, stages, skip, memory, mb):
    rules = PathRules.from_skip_ratio(stages, skip)
    if peers < stages:
        peers = stages
    problem = random_problem(seed, peers, stages, rules.stages_per_path, memory, mb)
    plan = plan_paths(problem, seed=seed, iterations=30)
    assert len(plan.routes) == sum(problem.microbatches)
    counts = np.zeros(stages, dtype=int)
    for r in plan.routes:
        assert path_violation(r.stages, rules) is None
        assert all(problem.stage_of[v] == s for s, v in zip(r.stages, r.nodes))
        assert problem.stage_of[r.origin] == 0
        counts[list(r.stages)] += 1
    if stages > 1 and rules.hops:
        assert counts[1:].max() - counts[1:].min() <= 1
        assert (counts == stage_budget(problem)).all()
    res = simulate(problem.tables, to_sim_routes(plan.routes), priority="backward_first")
    if not res.deadlocked:
        assert (res.peak_memory <= problem.tables.memory).all()


def test_random_skip_obeys_the_rules_too():
    problem = random_problem(1, 20, 6, 4, 3, 6)
    routes = random_skip(problem, seed=1)
    assert all(path_violation(r.stages, problem.rules) is None for r in routes)
    counts = np.bincount([s for r in routes for s in r.stages], minlength=6)[1:]
    assert counts.max() - counts.min() <= 1


def test_collision_awareness_improves_on_heterogeneous_swarm():
    problem = random_problem(7, 20, 6, 4, 3, 6)
    plain = plan_paths(problem, collision_aware=False)
    aware = plan_paths(problem, iterations=200)
    assert aware.makespan <= plain.makespan
    rnd = evaluate(problem, random_skip(problem, seed=0), "backward_first")[1].makespan
    assert aware.makespan < rnd


def test_problem_refuses_a_holder_off_stage_zero(reference):
    with pytest.raises(ValueError, match="not placed on stage 0"):
        PathProblem(reference.tables, stage_array(reference), (15,), (6,), PathRules(6, 4))
