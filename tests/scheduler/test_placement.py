import numpy as np

from scheduler.costs import CostTables
from scheduler.path_rules import PathRules
from scheduler.placement import (
    PlacementGoal,
    place,
    place_after_departure,
    place_joining,
    rebalance,
    score_placement,
    stage_sizes,
)
from scheduler.planner import default_model
from scheduler.profiles import preset, random_swarm


def test_sizing_rule_matches_the_reference():
    assert stage_sizes(20, PathRules(6, 4)) == [5, 3, 3, 3, 3, 3]
    assert stage_sizes(42, PathRules(8, 6)) == [7, 5, 5, 5, 5, 5, 5, 5]
    assert stage_sizes(7, PathRules(4, 3), data_holders=1) == [1, 2, 2, 2]


def tables_and_goal(n=14, stages=4):
    view = random_swarm(n, seed=2)
    tables = CostTables.from_view(view, default_model(stages))
    return tables, PlacementGoal(rules=PathRules(stages, 3), microbatches_per_holder=3)


def test_place_covers_every_stage_and_keeps_pins():
    tables, goal = tables_and_goal()
    stage_of = place(tables, goal, pinned={0: 0, 5: 2}, iterations=30)
    assert stage_of[0] == 0 and stage_of[5] == 2
    assert set(stage_of) == {0, 1, 2, 3}
    assert list(np.bincount(stage_of)) == stage_sizes(14, goal.rules, 1)


def test_placement_search_beats_its_start_on_geo_links():
    view = preset("geo-distributed", 20)
    tables = CostTables.from_view(view, default_model(6))
    goal = PlacementGoal(rules=PathRules(6, 4), microbatches_per_holder=6)
    from scheduler.placement import score_placement

    start = place(tables, goal, iterations=0)
    searched = place(tables, goal, iterations=60)
    assert score_placement(tables, searched, goal) <= score_placement(tables, start, goal)


def test_joining_peer_moves_nobody_else():
    tables, goal = tables_and_goal()
    stage_of = place(tables, goal, iterations=10)
    stage_of[13] = -1
    after = place_joining(tables, stage_of, 13, goal)
    assert after[13] in (1, 2, 3)
    assert (after[:13] == stage_of[:13]).all()


def test_a_joiner_restores_a_missing_data_holder_unless_a_stage_is_empty():
    tables, goal = tables_and_goal()
    stage_of = place(tables, goal, iterations=10)
    stage_of[13] = -1
    assert place_joining(tables, stage_of, 13, goal, holder_wanted=True)[13] == 0
    emptied = np.where(stage_of == 2, -1, stage_of)
    emptied[13] = -1
    assert place_joining(tables, emptied, 13, goal, holder_wanted=True)[13] == 2


def test_departure_refills_an_emptied_stage_with_one_move():
    tables, goal = tables_and_goal()
    stage_of = place(tables, goal, iterations=10)
    victims = [int(v) for v in np.flatnonzero(stage_of == 2)]
    after, moved = place_after_departure(tables, stage_of, victims, goal)
    assert len(moved) == 1 and after[moved[0]] == 2
    unchanged = [v for v in range(len(stage_of)) if v not in victims and v not in moved]
    assert (after[unchanged] == stage_of[unchanged]).all()
    assert all(after[v] == -1 for v in victims)


def test_departure_without_empty_stage_moves_nobody():
    tables, goal = tables_and_goal()
    stage_of = place(tables, goal, iterations=10)
    victim = int(np.flatnonzero(stage_of == 1)[0])
    after, moved = place_after_departure(tables, stage_of, [victim], goal)
    assert moved == []


def test_rebalance_moves_a_survivor_into_a_shrunk_group_only_when_it_pays():
    tables, goal = tables_and_goal()
    stage_of = place(tables, goal, iterations=10)
    group = [int(v) for v in np.flatnonzero(stage_of == 1)]
    shrunk = stage_of.copy()
    shrunk[group[1:]] = -1  # stage 1 keeps one peer of its group: every path through it waits on that peer
    after, counts, moves = rebalance(tables, shrunk, {1}, goal)
    assert len(moves) == 1
    (mover, source), = moves.items()
    assert shrunk[mover] not in (0, 1) and after[mover] == 1 and source == group[0]
    assert np.sum(after == shrunk[mover]) >= 1  # the mover's old stage keeps a peer
    others = [v for v in range(len(after)) if v != mover]
    assert (after[others] == shrunk[others]).all()
    assert score_placement(tables, after, goal) <= 0.9 * score_placement(tables, shrunk, goal)
    assert counts == {int(h): 3 for h in np.flatnonzero(shrunk == 0)}
    assert rebalance(tables, shrunk, {1}, goal, min_gain=0.99)[2] == {}  # not worth a move
    assert rebalance(tables, shrunk, {1}, goal, fixed=set(range(len(after))))[2] == {}  # nobody may move
    # a peer whose stage is not in force yet neither moves nor hands its (future) stage's state over
    assert mover not in rebalance(tables, shrunk, {1}, goal, unsettled={mover})[2]
    assert rebalance(tables, shrunk, {1}, goal, unsettled={group[0]})[2] == {}


def test_rebalance_refills_stage_0_only_to_take_a_carried_shard_over():
    tables, goal = tables_and_goal()
    stage_of = place(tables, goal, iterations=10)
    holders = [int(v) for v in np.flatnonzero(stage_of == 0)]
    shrunk = stage_of.copy()
    shrunk[holders[0]] = -1
    even = {h: 3 for h in holders[1:]}
    assert rebalance(tables, shrunk, {0}, goal, counts=even)[2] == {}  # nobody carries a second share
    carried = {**even, holders[1]: 6}
    after, counts, moves = rebalance(tables, shrunk, {0}, goal, counts=carried)
    (mover, source), = moves.items()
    assert after[mover] == 0 and source in holders[1:]
    assert counts == {**even, mover: 3} and sum(counts.values()) == sum(carried.values())
