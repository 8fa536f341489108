"""Expected makespan under measured message jitter: what it adds to the on-time simulation, and its inputs."""

import dataclasses

import numpy as np
import pytest

from scheduler.costs import CostTables, tables_from_dict, tables_to_dict
from scheduler.expected_makespan import expected_makespan
from scheduler.path_rules import PathRules
from scheduler.planner import PlanOptions, plan_tables
from scheduler.simulator import SimRoute, simulate
from scheduler.swarm_view import ModelCost, PeerSpec, SwarmView


def chain(jitter=None) -> CostTables:
    """a -> b -> c, one stage each, 0.1 s links."""
    return CostTables(ids=("a", "b", "c"), forward=np.ones((3, 3)), message=np.full((3, 3), 0.1) * (1 - np.eye(3)),
                      memory=np.full(3, 4), jitter=None if jitter is None else np.asarray(jitter, dtype=float))


ROUTE = [SimRoute(0, (0, 1, 2), (0, 1, 2))]


def test_without_measured_jitter_it_is_the_on_time_makespan():
    result = expected_makespan(chain(), ROUTE)
    assert result.draws == 0 and result.mean == result.deterministic == simulate(chain(), ROUTE).makespan


def test_a_constant_deviation_delays_every_message_between_peers():
    # 2 forward hops, the return to the origin for the loss, its gradient to the last peer, 2 backward hops
    on_time = simulate(chain(), ROUTE).makespan
    late = expected_makespan(chain([0.02]), ROUTE)
    assert late.deterministic == pytest.approx(on_time)
    assert late.mean == pytest.approx(on_time + 6 * 0.02) and late.p90 == pytest.approx(late.mean)
    # a deviation never makes a message faster than instantaneous
    assert expected_makespan(chain([-5.0]), ROUTE).mean == pytest.approx(on_time - 6 * 0.1)


def test_symmetric_jitter_on_a_tightly_packed_plan_costs_time_on_average():
    # b's activation is planned to reach c just as c finishes a's forward: lateness propagates, earliness cannot
    # be used, so the expected end is later than on time although the deviations average zero
    tables = CostTables(ids=("a", "b", "c"), forward=np.ones((3, 2)),
                        message=np.full((3, 3), 0.1) * (1 - np.eye(3)), memory=np.full(3, 4),
                        jitter=np.array([-0.05, 0.05]))
    routes = [SimRoute(0, (0, 2), (0, 1)), SimRoute(1, (1, 2), (0, 1), inject_at=1.0)]
    result = expected_makespan(tables, routes, draws=64)
    assert result.mean > result.deterministic
    assert result.p90 >= result.mean
    assert expected_makespan(tables, routes, draws=64) == result  # seeded


def test_jitter_travels_with_the_tables_and_is_checked():
    tables = chain([-0.01, 0.0, 0.03])
    assert np.array_equal(tables_from_dict(tables_to_dict(tables)).jitter, tables.jitter)
    assert tables_from_dict(tables_to_dict(chain())).jitter is None
    for bad in ([float("nan")], [100.0], [0.0] * 5000, [[0.0]]):
        with pytest.raises(ValueError, match="jitter"):
            tables_from_dict({**tables_to_dict(chain()), "jitter": bad})


def test_tables_pool_the_peers_measured_jitter():
    peers = [PeerSpec(id="a", seconds_per_layer=0.1, data_holder=True, message_jitter=(-0.01, 0.02)),
             PeerSpec(id="b", seconds_per_layer=0.1, message_jitter=(0.005,)),
             PeerSpec(id="c", seconds_per_layer=0.1)]
    view = SwarmView(peers=peers, latency=np.full((3, 3), 0.01), bandwidth=np.full((3, 3), 1e8))
    model = ModelCost.balanced(num_layers=2, num_stages=2, activation_bytes=1 << 16)
    assert CostTables.from_view(view, model).jitter.tolist() == [-0.01, 0.005, 0.02]
    quiet = SwarmView(peers=[dataclasses.replace(p, message_jitter=()) for p in peers], latency=view.latency,
                      bandwidth=view.bandwidth)
    assert CostTables.from_view(quiet, model).jitter is None
    with pytest.raises(ValueError, match="message_jitter"):
        PeerSpec(id="d", seconds_per_layer=0.1, message_jitter=(float("nan"),))


def test_a_schedule_planned_on_measured_jitter_predicts_the_expected_iteration():
    rng = np.random.default_rng(3)
    n = 6
    base = CostTables(ids=tuple(f"p{i}" for i in range(n)), forward=rng.uniform(0.5, 1.0, (n, 3)),
                      message=rng.uniform(0.05, 0.3, (n, n)) * (1 - np.eye(n)), memory=np.full(n, 3))
    jittery = dataclasses.replace(base, jitter=np.array([-0.02, 0.0, 0.01, 0.08]))
    rules = PathRules(num_stages=3, stages_per_path=2)
    options = PlanOptions(microbatches_per_holder=2, iterations=30, placement_iterations=10)
    stage_of = np.array([0, 0, 1, 1, 2, 2])
    on_time = plan_tables(base, rules, options, stage_of=stage_of)
    schedule = plan_tables(jittery, rules, options, stage_of=stage_of)
    assert "on_time_seconds" not in on_time.meta
    assert schedule.meta["on_time_seconds"] <= schedule.predicted_iteration_seconds
    assert schedule.meta["jitter_p90_seconds"] >= schedule.predicted_iteration_seconds


def test_the_jitter_polish_never_worsens_the_expected_makespan_and_is_off_without_jitter():
    from scheduler.paths import PathProblem, evaluate, plan_paths

    rng = np.random.default_rng(5)
    n = 8
    tables = CostTables(ids=tuple(f"p{i}" for i in range(n)), forward=rng.uniform(0.5, 1.0, (n, 4)),
                        message=rng.uniform(0.05, 0.3, (n, n)) * (1 - np.eye(n)), memory=np.full(n, 2))
    stage_of = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    problem = PathProblem(tables, stage_of, (0, 1), (3, 3), PathRules(num_stages=4, stages_per_path=3))
    on_time = plan_paths(problem, iterations=60)
    assert plan_paths(problem, iterations=60, jitter_draws=8, jitter_polish=40).routes == on_time.routes
    jittery = PathProblem(dataclasses.replace(tables, jitter=np.array([-0.05, -0.01, 0.0, 0.02, 0.1, 0.3])),
                          stage_of, (0, 1), (3, 3), problem.rules)
    base = plan_paths(jittery, iterations=60)
    polished = plan_paths(jittery, iterations=60, jitter_draws=8, jitter_polish=40)
    assert base.routes == on_time.routes  # the on-time search ignores jitter
    assert evaluate(jittery, polished.routes, "backward_first", draws=8)[0] <= \
        evaluate(jittery, base.routes, "backward_first", draws=8)[0]
    assert polished.iterations > base.iterations
