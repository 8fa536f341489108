"""The SWARM-style baseline: stochastic wiring in proportion to throughput, placement balanced by throughput, and
rebalancing toward the bottleneck stage."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from scheduler.costs import CostTables
from scheduler.path_rules import PathRules
from scheduler.paths import PathProblem
from scheduler.planner import (
    PlanOptions,
    baseline_schedule,
    default_model,
    plan,
    plan_swarm,
    swarm_schedule,
    swarm_wiring_for_iteration,
)
from scheduler.profiles import random_swarm
from scheduler.schedule import validate
from scheduler.swarm_balance import (
    bottleneck,
    join_stage,
    rebalance_once,
    stage_throughput,
    swarm_placement,
)
from scheduler.swarm_tuning import move_pays, score_over_draws, tune_swarm_placement
from scheduler.swarm_wiring import (
    draw_routes,
    expected_makespan_over_draws,
    hop_probabilities,
    redraw,
    wiring_rng,
)


def tables_of(forward_per_peer: list[float], stages: int, message: np.ndarray | None = None) -> CostTables:
    """Peers whose forward at every stage takes `forward_per_peer[v]` seconds; free links unless given."""
    n = len(forward_per_peer)
    forward = np.repeat(np.array(forward_per_peer, dtype=float)[:, None], stages, axis=1)
    return CostTables(ids=tuple(f"p{v}" for v in range(n)), forward=forward,
                      message=np.zeros((n, n)) if message is None else message, memory=np.full(n, 3))


def test_every_path_visits_every_stage_in_order_on_placed_peers():
    view = random_swarm(20, seed=3)
    schedule = plan_swarm(view, default_model(6), PathRules(6, 4), PlanOptions(microbatches_per_holder=5, seed=3,
                                                                                  placement_iterations=10))
    validate(schedule)  # placement, hops served by their stage, stage balance
    assert schedule.planner == "swarm"
    assert {r.stages for r in schedule.routes} == {(1, 2, 3, 4, 5)}
    assert all(schedule.placement[p] == s for r in schedule.routes for s, p in zip(r.stages, r.peers))
    holders = schedule.data_holders
    assert len(holders) == 3  # the sizing rule for 20 peers on paths through all 6 stages
    assert Counter(r.origin for r in schedule.routes) == {h: 5 for h in holders}
    assert np.all(np.bincount(list(schedule.placement.values())) >= 2)
    assert np.isfinite(schedule.predicted_iteration_seconds)
    over = schedule.meta["over_draws_seconds"]
    assert over["min"] <= over["mean"] <= over["max"] and over["draws"] >= 3


def test_draws_follow_the_peers_throughput():
    # one data holder, then three stage-1 peers of rates 4 : 2 : 1 (compute only, free links), one stage-2 peer
    tables = tables_of([0.1, 0.1, 0.2, 0.4, 0.1], stages=3)
    stage_of = np.array([0, 1, 1, 1, 2])
    problem = PathProblem(tables, stage_of, (0,), (7000,), PathRules(3, 3, max_swaps=0))
    members, p = hop_probabilities(problem, 0, 1)
    assert list(members) == [1, 2, 3] and np.allclose(p, [4 / 7, 2 / 7, 1 / 7])
    routes = draw_routes(problem, wiring_rng(seed=0))
    counts = Counter(r.nodes[0] for r in routes)
    for v, share in zip((1, 2, 3), (4 / 7, 2 / 7, 1 / 7)):
        sigma = np.sqrt(share * (1 - share) / 7000)
        assert abs(counts[v] / 7000 - share) < 4 * sigma, (v, counts[v])
    assert {r.nodes[1] for r in routes} == {4}


def test_a_slow_link_draws_fewer_microbatches():
    # equal compute; the holder's link to peer 2 costs as much as the peer's whole compute
    message = np.zeros((4, 4))
    message[0, 2] = message[2, 0] = 0.125  # round trip 0.25 s = 2.5 x 0.1 s of compute: half the rate
    tables = tables_of([0.1, 0.1, 0.1, 0.1], stages=3, message=message)
    problem = PathProblem(tables, np.array([0, 1, 1, 2]), (0,), (3000,), PathRules(3, 3, max_swaps=0))
    _, p = hop_probabilities(problem, 0, 1)
    assert np.allclose(p, [2 / 3, 1 / 3])
    counts = Counter(r.nodes[0] for r in draw_routes(problem, wiring_rng(seed=1)))
    assert abs(counts[1] / 3000 - 2 / 3) < 4 * np.sqrt(2 / 9 / 3000)


def test_the_wiring_is_reproducible_from_its_seed_and_redrawn_per_epoch_and_iteration():
    tables = CostTables.from_view(random_swarm(12, seed=1), default_model(4))
    stage_of = swarm_placement(tables, 4, 3)
    holders = tuple(int(h) for h in np.flatnonzero(stage_of == 0))
    problem = PathProblem(tables, stage_of, holders, (4,) * len(holders), PathRules(4, 4, max_swaps=0))
    nodes = lambda routes: [r.nodes for r in routes]  # noqa: E731
    assert nodes(redraw(problem, 7, 2, 5)) == nodes(redraw(problem, 7, 2, 5))
    assert nodes(redraw(problem, 7, 2, 5)) != nodes(redraw(problem, 7, 2, 6))
    assert nodes(redraw(problem, 7, 2, 5)) != nodes(redraw(problem, 7, 3, 5))
    times = expected_makespan_over_draws(problem, seed=7, draws=6)
    assert times.shape == (6,) and np.all(np.isfinite(times)) and len(set(times.round(6))) > 1


def test_rebalancing_moves_a_peer_from_the_least_loaded_stage_to_the_bottleneck():
    # stage 1: three fast peers (the least loaded); stage 2: one slow peer (the bottleneck); stage 3: two
    tables = tables_of([0.1, 0.1, 0.1, 0.1, 0.4, 0.1, 0.1], stages=4)
    stage_of = np.array([0, 1, 1, 1, 2, 3, 3])
    before = stage_throughput(tables, stage_of, 4)
    assert bottleneck(tables, stage_of, 4) == 2 and int(np.argmax(before[1:])) + 1 == 1
    out, move = rebalance_once(tables, stage_of, 4)
    assert move is not None and move[1:] == (1, 2) and stage_of[move[0]] == 1 and out[move[0]] == 2
    after = stage_throughput(tables, out, 4)
    assert after[1:].min() > before[1:].min()
    assert list(stage_of) == [0, 1, 1, 1, 2, 3, 3]  # the input placement is not changed


def test_rebalancing_stops_when_no_move_helps_and_keeps_fixed_peers():
    tables = tables_of([0.1] * 7, stages=4)
    balanced = np.array([0, 1, 1, 2, 2, 3, 3])
    out, move = rebalance_once(tables, balanced, 4)
    assert move is None and list(out) == list(balanced)
    lopsided = np.array([0, 1, 1, 1, 1, 2, 3])
    _, move = rebalance_once(tables, lopsided, 4, fixed={1, 2, 3, 4})
    assert move is None


def test_an_emptied_stage_is_the_bottleneck_a_joiner_or_a_rebalancing_move_fills():
    tables = tables_of([0.1] * 6, stages=4)
    stage_of = np.array([0, 1, 1, 1, 3, -1])
    assert join_stage(tables, stage_of, 4) == 2
    assert join_stage(tables, stage_of, 4, avoid=(2,)) == 3  # a stage it gave up: the next bottleneck
    assert join_stage(tables, stage_of, 4, avoid=(1, 2, 3)) == 2  # nowhere else to go
    out, move = rebalance_once(tables, stage_of, 4)
    assert move is not None and move[1:] == (1, 2) and np.all(np.bincount(out[out >= 0], minlength=4) >= 1)


def test_swarm_placement_balances_throughput_and_keeps_pins():
    tables = CostTables.from_view(random_swarm(20, seed=4), default_model(6))
    pinned = {0: 0, 1: 0, 7: 3}
    stage_of = swarm_placement(tables, 6, 5, pinned=pinned)
    assert stage_of[0] == 0 and stage_of[1] == 0 and stage_of[7] == 3
    assert np.sum(stage_of == 0) == 5 and np.all(np.bincount(stage_of, minlength=6) >= 1)
    _, move = rebalance_once(tables, stage_of, 6, fixed=set(pinned) | set(np.flatnonzero(stage_of == 0)))
    assert move is None  # placement ends where no rebalancing step helps
    # better balanced than dealing the same non-holders round-robin over the stages
    naive = stage_of.copy()
    rest = [v for v in range(20) if stage_of[v] != 0 and v != 7]
    for k, v in enumerate(rest):
        naive[v] = 1 + k % 5
    assert stage_throughput(tables, stage_of, 6)[1:].min() >= stage_throughput(tables, naive, 6)[1:].min()


def test_the_baseline_on_a_skippipe_schedule_keeps_its_holders_and_work():
    view = random_swarm(14, seed=5)
    options = PlanOptions(microbatches_per_holder=3, seed=5, iterations=30, placement_iterations=10,
                          jitter_polish=0)
    ours = plan(view, default_model(4), PathRules(4, 3), options)
    tables = CostTables.from_view(view, default_model(4))
    base = baseline_schedule(ours, tables, "swarm", seed=5)
    validate(base)
    assert base.planner == "swarm" and base.data_holders == ours.data_holders
    assert len(base.routes) == len(ours.routes) and {r.stages for r in base.routes} == {(1, 2, 3)}


def test_a_stage_without_peers_is_left_out_of_every_path():
    tables = tables_of([0.1] * 5, stages=4)
    schedule = swarm_schedule(tables, np.array([0, 1, 1, 3, 3]), 4, microbatches_per_holder=4, draws=2)
    assert {r.stages for r in schedule.routes} == {(1, 3)} and schedule.rules.unserved == frozenset({2})


def test_invalid_inputs_are_refused():
    tables = tables_of([0.1] * 5, stages=4)
    with pytest.raises(ValueError, match="cannot serve"):
        swarm_placement(tables_of([0.1] * 3, stages=4), 4, 1)
    with pytest.raises(ValueError, match="stages asked"):
        swarm_placement(tables, 3, 1)
    with pytest.raises(ValueError, match="in range"):
        swarm_placement(tables, 4, 1, pinned={9: 0})
    with pytest.raises(ValueError, match="in range"):
        swarm_placement(tables, 4, 1, pinned={0: 4})
    with pytest.raises(ValueError, match="data holders"):
        swarm_placement(tables, 4, 1, pinned={0: 0, 1: 0})
    with pytest.raises(ValueError, match="data holders"):
        swarm_placement(tables, 4, 3)  # two peers left for three stages
    with pytest.raises(ValueError, match="one stage per peer"):
        stage_throughput(tables, np.array([0, 1, 2]), 4)
    with pytest.raises(ValueError, match="-1 .unplaced. or"):
        stage_throughput(tables, np.array([0, 1, 2, 3, 7]), 4)
    with pytest.raises(ValueError, match="non-negative"):
        wiring_rng(-1)
    with pytest.raises(ValueError, match="non-negative"):
        wiring_rng(0, iteration=True)
    skip = PathProblem(tables, np.array([0, 1, 2, 3, 3]), (0,), (2,), PathRules(4, 3))
    with pytest.raises(ValueError, match="visits all"):
        draw_routes(skip, wiring_rng(0))
    with pytest.raises(ValueError, match="draws"):
        expected_makespan_over_draws(PathProblem(tables, np.array([0, 1, 2, 3, 3]), (0,), (2,),
                                                 PathRules(4, 4, max_swaps=0)), draws=0)


def test_the_tuned_placement_keeps_holders_and_scores_no_worse_than_throughput_balance():
    tables = CostTables.from_view(random_swarm(12, seed=6), default_model(4))
    balanced = swarm_placement(tables, 4, 3)
    holders = tuple(int(h) for h in np.flatnonzero(balanced == 0))
    problem = PathProblem(tables, balanced, holders, (3,) * 3, PathRules(4, 4, max_swaps=0))
    tuned, score = tune_swarm_placement(problem, seed=6, iterations=25, draws=3)
    assert list(np.flatnonzero(tuned == 0)) == list(holders)
    assert np.all(np.bincount(tuned, minlength=4) >= 1)
    assert score <= score_over_draws(problem, seed=6, draws=3)
    again = PathProblem(tables, tuned, holders, (3,) * 3, PathRules(4, 4, max_swaps=0))
    assert score == pytest.approx(score_over_draws(again, seed=6, draws=3))
    with pytest.raises(ValueError, match="iterations"):
        tune_swarm_placement(problem, iterations=-1)
    with pytest.raises(ValueError, match="draws"):
        score_over_draws(problem, seed=0, draws=0)


def test_the_wiring_of_any_iteration_follows_from_the_schedule_alone():
    view = random_swarm(10, seed=8)
    schedule = plan_swarm(view, default_model(4), PathRules(4, 3), PlanOptions(microbatches_per_holder=3, seed=8,
                                                                                placement_iterations=5))
    same = swarm_wiring_for_iteration(schedule, 0)
    assert same.routes == schedule.routes
    later = [swarm_wiring_for_iteration(schedule, i) for i in (1, 2)]
    for other in later:
        validate(other)
        assert [(r.microbatch, r.origin, r.stages) for r in other.routes] == \
            [(r.microbatch, r.origin, r.stages) for r in schedule.routes]
        assert other.placement == schedule.placement and other.epoch == schedule.epoch
    assert len({tuple(r.peers for r in s.routes) for s in (schedule, *later)}) == 3
    assert swarm_wiring_for_iteration(schedule, 2).routes == later[1].routes
    with pytest.raises(ValueError, match="SWARM-style"):
        swarm_wiring_for_iteration(replace(schedule, planner="skippipe"), 1)
    with pytest.raises(ValueError, match="non-negative"):
        swarm_wiring_for_iteration(replace(schedule, meta={**schedule.meta, "wiring": {"seed": -3, "epoch": 0}}), 1)
    with pytest.raises(ValueError, match="iteration"):
        swarm_wiring_for_iteration(schedule, -1)


def test_a_rebalancing_move_is_checked_against_the_simulated_iteration():
    tables = tables_of([0.1, 0.1, 0.1, 0.1, 0.4, 0.1, 0.1], stages=4)
    lopsided = np.array([0, 1, 1, 1, 2, 3, 3])  # stage 2: one slow peer, the bottleneck
    moved, move = rebalance_once(tables, lopsided, 4)
    counts = {0: 6}
    assert move is not None and move_pays(tables, lopsided, moved, counts, draws=3)
    assert not move_pays(tables, moved, lopsided, counts, draws=3)
    assert move_pays(tables, lopsided, lopsided, counts, draws=3)
    with pytest.raises(ValueError, match="not placed on stage 0"):
        move_pays(tables, lopsided, moved, {1: 6}, draws=3)
