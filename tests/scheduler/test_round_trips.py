"""Planned round trips, the base of per-hop deadlines: every peer that sends a microbatch on gets one, and none is
shorter than the work and messages that must happen before the backward can be back."""

from __future__ import annotations

from scheduler.costs import tables_from_dict
from scheduler.path_rules import PathRules
from scheduler.planner import plan_for_profile
from scheduler.round_trips import round_trips
from scheduler.schedule import Route, Schedule


def test_every_sender_gets_a_round_trip_no_shorter_than_the_path_behind_it():
    schedule = plan_for_profile("geo-distributed", num_peers=12, num_stages=6, skip=0.33, microbatches_per_holder=3,
                                iterations=20)
    tables = tables_from_dict(schedule.meta["costs"])
    trips = round_trips(schedule)
    idx = {p: i for i, p in enumerate(tables.ids)}
    for r in schedule.routes:
        nodes, stages = r.nodes, (0, *r.stages)
        assert {(p, r.microbatch) for p in nodes} <= set(trips)
        for k, peer in enumerate(nodes):
            # after peer k's forward: the forwards behind it, back to the holder, the loss, the backwards down to it
            later = range(k + 1, len(nodes))
            work = sum(tables.forward[idx[nodes[j]], stages[j]] * (1 + tables.backward_factor) for j in later)
            work += tables.forward[idx[nodes[0]], 0] * tables.loss_factor
            hops = [*zip(nodes[k:], nodes[k + 1:]), (nodes[-1], nodes[0])]
            messages = sum(tables.message[idx[a], idx[b]] + tables.message[idx[b], idx[a]] for a, b in hops)
            assert work + messages - 1e-9 <= trips[(peer, r.microbatch)] <= schedule.predicted_iteration_seconds


def test_a_schedule_without_costs_has_no_round_trips():
    s = Schedule(epoch=0, rules=PathRules(num_stages=2, stages_per_path=2), placement={"a": 0, "b": 1},
                 memory={"a": 3, "b": 3}, routes=(Route(microbatch=0, origin="a", stages=(1,), peers=("b",)),))
    assert round_trips(s) == {}
