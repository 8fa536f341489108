import dataclasses

import numpy as np
import pytest

from scheduler.baselines import full_pipeline
from scheduler.costs import CostTables
from scheduler.instance import reference_routes
from scheduler.path_rules import PathRules
from scheduler.paths import PathProblem, to_sim_routes
from scheduler.simulator import BACKWARD, FORWARD, SimRoute, simulate
from tests.scheduler.conftest import stage_array

METHODS = ["full_pipeline_dtfm", "random_skip", "skippipe_without_collision_awareness", "skippipe"]


def test_reference_makespans_within_5_percent_and_in_order(reference):
    expected = reference.raw["expected_iteration_seconds"]
    ours = {}
    for method in METHODS:
        ours[method] = simulate(reference.tables, reference_routes(reference, method)).makespan
        assert ours[method] == pytest.approx(expected[method], rel=0.05), method
    assert sorted(METHODS, key=ours.get) == sorted(METHODS, key=expected.get)


def test_full_pipeline_with_all_30_microbatches_takes_about_102_seconds(reference):
    problem = PathProblem(reference.tables, stage_array(reference), reference.data_holders, (6,) * 5,
                          PathRules(6, 6, max_swaps=0))
    columns = [[reference.partitions[s][k] for s in range(6)] for k in range(3)]  # the placement's columns
    routes = to_sim_routes(full_pipeline(problem, columns))
    assert len(routes) == 30
    assert simulate(reference.tables, routes).makespan == pytest.approx(102.5, rel=0.05)


def test_isolated_microbatch_matches_the_method_formula(reference):
    t = reference.tables
    nodes, stages = (0, 14, 6, 12), (0, 1, 2, 3)
    no_gaps = dataclasses.replace(t, op_gap=0.0, inject_gap=0.0)
    res = simulate(no_gaps, [SimRoute(0, nodes, stages)])
    w = 0.44
    hops = t.message[0, 14] + t.message[14, 6] + t.message[6, 12] + t.message[12, 0]
    assert res.makespan == pytest.approx(2.5 * 4 * w + 0.25 * w + 2 * hops)
    assert res.makespan == pytest.approx(t.isolated_route_seconds(list(nodes), list(stages)))


def tiny_tables(memory: int) -> CostTables:
    n = 3
    return CostTables(ids=("a", "b", "c"), forward=np.full((n, 2), 1.0),
                      message=np.full((n, n), 0.1) * (1 - np.eye(n)), memory=np.full(n, memory))


def test_memory_admission_holds_forward_passes_back():
    routes = [SimRoute(i, (0, 1), (0, 1)) for i in range(4)]
    for memory in (1, 2, 4):
        res = simulate(tiny_tables(memory), routes, record_ops=True)
        assert res.peak_memory.max() <= memory
        assert not res.deadlocked
    assert simulate(tiny_tables(1), routes).makespan > simulate(tiny_tables(4), routes).makespan


def test_backward_first_serves_waiting_backward_before_forward():
    routes = [SimRoute(i, (0, 1), (0, 1)) for i in range(3)]
    res = simulate(tiny_tables(3), routes, priority="backward_first", record_ops=True)
    on_b = [op for op in res.ops if op.node == 1]
    # whenever a backward was waiting when peer b picked its next op, it went first
    for prev, op in zip(on_b, on_b[1:]):
        waiting_bwd = [o for o in on_b if o.kind == BACKWARD and o.arrived <= prev.end and o.start >= op.start]
        if waiting_bwd and op.kind == FORWARD:
            pytest.fail(f"forward {op} served before waiting backward {waiting_bwd[0]}")


def test_collisions_are_counted_when_forwards_meet():
    routes = [SimRoute(0, (0, 2), (0, 1)), SimRoute(1, (1, 2), (0, 1))]
    t = CostTables(ids=("a", "b", "c"), forward=np.ones((3, 2)), message=np.full((3, 3), 0.1) * (1 - np.eye(3)),
                   memory=np.full(3, 3))
    res = simulate(t, routes)
    assert res.collisions == 1 and res.collision_delay == pytest.approx(1.0)


def test_deadlock_is_reported_not_hung():
    # a -> b and b -> a with one slot each: each holds its own activation and waits for the other's slot
    t = CostTables(ids=("a", "b"), forward=np.ones((2, 2)), message=np.full((2, 2), 0.1) * (1 - np.eye(2)),
                   memory=np.array([1, 1]))
    res = simulate(t, [SimRoute(0, (0, 1), (0, 1)), SimRoute(1, (1, 0), (0, 1))])
    assert res.deadlocked and res.makespan == float("inf")


def test_each_holder_takes_its_own_measured_loss_time():
    import dataclasses

    from scheduler.costs import tables_from_dict, tables_to_dict
    from scheduler.swarm_view import ModelCost, PeerSpec, SwarmView

    base = tiny_tables(3)
    measured = dataclasses.replace(base, loss=np.array([0.7, 0.25, 0.25]))  # holder a's loss step is slow
    route = [SimRoute(0, (0, 1), (0, 1))]
    assert simulate(measured, route).makespan - simulate(base, route).makespan == pytest.approx(0.7 - 0.25)
    assert measured.isolated_route_seconds([0, 1], [0, 1]) == pytest.approx(simulate(measured, route).makespan)
    again = tables_from_dict(tables_to_dict(measured))
    assert np.array_equal(again.loss, measured.loss) and tables_from_dict(tables_to_dict(base)).loss is None
    # from the peers' records: measured where they measured, the model's factor elsewhere
    view = SwarmView([PeerSpec("a", 0.5, loss_seconds=0.9), PeerSpec("b", 0.5)], np.zeros((2, 2)),
                     np.full((2, 2), 1e9))
    tables = CostTables.from_view(view, ModelCost(layers_per_stage=(2, 2), activation_bytes=1, loss_factor=0.5))
    assert tables.loss_times().tolist() == pytest.approx([0.9, 0.5])
