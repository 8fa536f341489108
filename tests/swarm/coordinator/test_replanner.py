"""The replanner plans with the configured method (SkipPipe or a baseline) on the peers' measured records, and
keeps that method when it re-plans after a departure."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler.path_rules import PathRules
from scheduler.schedule import Schedule, validate
from swarm.coordinator.epochs import EpochHistory
from swarm.coordinator.reckoning import restore_sources
from swarm.coordinator.replanner import saved_plan_mismatch
from swarm.run_config import FULL_PATH_PLANNERS, PLANNERS, RunConfig
from swarm.stage_group.state_transfer import state_senders
from swarm.wire import PeerState
from tests.swarm.coordinator.conftest import STAGES, make_config, make_records, make_replanner


@pytest.mark.parametrize("planner", PLANNERS)
def test_each_planner_gives_a_valid_schedule_and_keeps_its_method_on_replanning(planner, records):
    r = make_replanner(planner)
    schedule = r.plan(records, epoch=0, start_iteration=0)
    validate(schedule)
    expected = {"skippipe": "skippipe", "skippipe-no-collision": "skippipe_without_collision_awareness",
                "full-pipeline": "full_pipeline", "random-skip": "random_skip", "swarm": "swarm"}[planner]
    assert schedule.planner == expected and schedule.run_id == "plan-test"
    lengths = {len(route.stages) for route in schedule.routes}
    assert lengths == ({STAGES - 1} if planner in FULL_PATH_PLANNERS else {3})  # R = 4 of 6 stages with skip 0.33
    assert sum(len(schedule.routes_from(h)) for h in schedule.data_holders) == 4 * schedule.meta["num_shards"]
    if planner == "full-pipeline":  # its 2 holders carry the 3 shards of SkipPipe's 3 holders: the same work
        assert sorted(k for ks in schedule.meta["shards"].values() for k in ks) == [0, 1, 2]
    gone = next(p for p in schedule.placement if schedule.placement[p] == 3)
    again = r.replan({p: rec for p, rec in records.items() if p != gone}, EpochHistory([schedule]),
                     start_iteration=5, shard_positions={})
    assert again.planner == expected and gone not in again.placement and again.epoch == 1
    # survivors keep their stages, but for a move into the shrunk group, which takes its state from a peer there
    moved = {p for p, s in schedule.placement.items() if p != gone and again.placement[p] != s}
    # (SWARM's move goes to its bottleneck by throughput, which need not be the shrunk group)
    target = {p: 3 if planner != "swarm" else again.placement[p] for p in moved}
    assert moved == set(again.meta["handover"]) and all(again.placement[p] == target[p] for p in moved)
    assert all(schedule.placement[again.meta["handover"][p]] == target[p] for p in moved)


def test_skippipe_beats_the_full_pipeline_on_the_geo_links(records):
    predicted = {}
    for planner in ("skippipe", "full-pipeline"):
        schedule = make_replanner(planner).plan(records, epoch=0, start_iteration=0)
        predicted[planner] = schedule.predicted_iteration_seconds
        assert np.isfinite(predicted[planner])
    assert predicted["skippipe"] < 0.75 * predicted["full-pipeline"]


def test_a_successor_scheduler_plans_as_the_run_spec_says():
    config = RunConfig(run_id="plan-test", planner="full-pipeline", rebalance=False)
    spec = config.to_spec(coordinator="coordinator", vocab_size=config.model_config(8192).vocab_size)
    again, _ = RunConfig.from_spec(spec)
    assert again.planner == "full-pipeline" and again.rebalance is False


def test_an_unknown_planner_is_refused():
    with pytest.raises(ValueError, match="swarm.planner"):
        RunConfig.from_tables({"swarm": {"planner": "fastest"}})


def test_a_saved_plan_of_another_method_or_shape_is_refused(records):
    saved = make_replanner("full-pipeline").plan(records, epoch=0, start_iteration=0)
    assert saved_plan_mismatch(saved, make_config("full-pipeline")) is None
    assert "'full_pipeline' planner" in saved_plan_mismatch(saved, make_config("skippipe"))
    three = dataclasses.replace(make_config("full-pipeline"), stages=3)
    assert "6 stages, the run 3" in saved_plan_mismatch(saved, three)


def test_a_full_pipeline_places_a_joiner_where_its_columns_lost_a_peer():
    r = make_replanner("full-pipeline")
    pins = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]  # two columns, every peer in one
    peers = {p: dataclasses.replace(rec, stage=pins[i]) for i, (p, rec) in enumerate(sorted(make_records().items()))}
    history = EpochHistory([r.plan(peers, epoch=0, start_iteration=0)])
    assert len({route.peers for route in history.latest.routes}) == 2
    victim = sorted(peers)[6]  # a stage 3 peer: one column is left
    live = {p: dataclasses.replace(rec, stage=-1) for p, rec in peers.items() if p != victim}
    history.add(r.replan(live, history, start_iteration=4, shard_positions={}))
    assert len({route.peers for route in history.latest.routes}) == 1
    newcomer = dataclasses.replace(peers[victim], peer_id="newcomer", stage=-1, state=PeerState.JOINING)
    joined = r.replan({**live, "newcomer": newcomer}, history, start_iteration=8, shard_positions={})
    assert joined.placement["newcomer"] == 3


def test_a_full_pipeline_gives_every_shard_to_the_holders_its_columns_start_at():
    r = make_replanner("full-pipeline")
    # three holders, one peer on stage 1: one column, so two holders inject nothing
    pins = [0, 0, 0, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    peers = {p: dataclasses.replace(rec, stage=pins[i]) for i, (p, rec) in enumerate(sorted(make_records().items()))}
    schedule = r.plan(peers, epoch=0, start_iteration=0)
    (injector,) = {route.origin for route in schedule.routes}
    assert schedule.meta["shards"][injector] == [0, 1, 2]
    assert not any(ks for h, ks in schedule.meta["shards"].items() if h != injector)
    # the injecting holder dies: the column starts at another holder, which takes every shard over
    again = r.replan({p: rec for p, rec in peers.items() if p != injector}, EpochHistory([schedule]),
                     start_iteration=3, shard_positions={})
    (successor,) = {route.origin for route in again.routes}
    assert sorted(again.meta["shards"][successor]) == [0, 1, 2]
    assert injector not in again.meta["shards"]


def test_a_full_pipeline_gets_its_own_placement_with_as_many_columns_as_the_peers_allow(records):
    """SkipPipe's groups on 12 peers (3, 2, 2, 2, 2, 1) would leave a full pipeline one column and half its peers
    idle; its own placement sizes the groups for paths through every stage: two columns, every peer in one."""
    skippipe = make_replanner("skippipe").plan(records, epoch=0, start_iteration=0)
    full = make_replanner("full-pipeline").plan(records, epoch=0, start_iteration=0)
    groups = lambda s: sorted(np.bincount(list(s.placement.values()), minlength=STAGES).tolist())  # noqa: E731
    assert min(groups(skippipe)) == 1 and groups(full) == [2] * STAGES
    assert len({route.peers for route in full.routes}) == 2
    assert {p for route in full.routes for p in (route.origin, *route.peers)} == set(records)
    assert len(full.routes) == len(skippipe.routes)  # the same microbatches: SkipPipe's shards, 4 each


def test_a_peer_taken_for_gone_and_placed_again_on_another_stage_loads_that_stage_as_a_joiner():
    """A live peer whose record a DHT hiccup hid is dropped, then placed again by a later epoch from the same
    iteration: where it lands on another stage than it held, it must load that stage's state (a joiner), not
    train that stage from its own, other stage's weights."""
    r = make_replanner("skippipe")
    records = make_records()
    first = r.plan(records, epoch=0, start_iteration=0)
    moved = []
    for victim in sorted(first.placement):
        history = EpochHistory([first])
        live = {p: rec for p, rec in records.items() if p != victim}
        history.add(r.replan(live, history, start_iteration=5, shard_positions={}))
        back = dataclasses.replace(records[victim], stage=-1, state=PeerState.JOINING)
        again = r.replan({**live, victim: back}, history, start_iteration=5, shard_positions={})
        if again.placement[victim] != first.placement[victim]:
            moved.append(victim)
            assert victim in again.meta["joiners"] and victim not in again.meta["handover"]
        else:  # back on its own stage from the iteration it left at: its weights are that stage's, current
            assert victim not in again.meta["joiners"]
    assert moved, "no victim was placed again on another stage: the case under test did not arise"


def test_a_peer_that_holds_no_state_is_a_joiner_and_is_placed_off_the_stage_it_gave_up():
    """A joiner whose stage's state did not come gives its placement up and joins again, as a restarted process
    does: it holds nothing, whatever the epochs say, and another stage is tried (that stage's veterans may withhold
    their state: placed there again, it would wait and give up for ever)."""
    r = make_replanner("skippipe")
    records = make_records()
    first = r.plan(records, epoch=0, start_iteration=0)
    for victim in sorted(first.placement):
        history = EpochHistory([first])
        live = {p: rec for p, rec in records.items() if p != victim}
        history.add(r.replan(live, history, start_iteration=5, shard_positions={}))
        back = dataclasses.replace(records[victim], stage=first.placement[victim], state=PeerState.JOINING)
        again = r.replan({**live, victim: back}, history, start_iteration=5, shard_positions={}, stateless={victim})
        assert victim in again.meta["joiners"]
        stage = again.placement[victim]
        assert stage != first.placement[victim]  # neither its last stage nor the one it announces
        veterans = [p for p, st in again.placement.items() if st == stage and p not in again.meta["joiners"]]
        assert veterans or victim in again.meta["restore"]  # someone to take the stage from


def test_a_newcomer_that_asks_for_a_stage_is_placed_there_the_first_time_only():
    """`--stage` is honoured when a peer first joins mid-run, as in the first plan; a peer placed before announces
    the stage it last served, which says nothing about where it should go now."""
    r = make_replanner("skippipe")
    records = make_records()
    newcomer = "peer-11"
    first = r.plan({p: rec for p, rec in records.items() if p != newcomer}, epoch=0, start_iteration=0)
    history = EpochHistory([first])
    unasked = r.replan(records, history, start_iteration=3, shard_positions={})
    asked = next(st for st in range(1, STAGES) if st != unasked.placement[newcomer])
    pinned = {**records, newcomer: dataclasses.replace(records[newcomer], stage=asked, state=PeerState.JOINING)}
    placed = r.replan(pinned, history, start_iteration=3, shard_positions={})
    assert placed.placement[newcomer] == asked and newcomer in placed.meta["joiners"]
    history.add(placed)
    history.add(r.replan(records_without(pinned, newcomer), history, start_iteration=4, shard_positions={}))
    again = r.replan(pinned, history, start_iteration=5, shard_positions={}, stateless={newcomer})
    assert again.placement[newcomer] != asked  # it gave that stage up
    # stage 0 is for a shard that lost its holder: every shard has one, so a peer without data goes elsewhere
    first_zero = {**records, newcomer: dataclasses.replace(records[newcomer], stage=0, state=PeerState.JOINING)}
    placed = r.replan(first_zero, EpochHistory([first]), start_iteration=3, shard_positions={})
    assert placed.placement[newcomer] != 0 and all(placed.meta["shards"][h] for h in placed.data_holders)


def test_a_joiner_still_loading_its_stage_stays_a_joiner_in_the_next_epochs():
    """An epoch that places a joiner does not give it its stage's state: while its record says it is joining, the
    epochs after it (from the next iteration, as a join elsewhere or a death makes them) list it as a joiner still,
    so that its stage's veterans equip it and it does not give its join up; once online it is a veteran."""
    r = make_replanner("skippipe")
    records = make_records()
    newcomer = "peer-11"
    first = r.plan(records_without(records, newcomer), epoch=0, start_iteration=0)
    history = EpochHistory([first])
    joining = {**records, newcomer: dataclasses.replace(records[newcomer], state=PeerState.JOINING)}
    placed = r.replan(joining, history, start_iteration=3, shard_positions={})
    assert newcomer in placed.meta["joiners"]
    history.add(placed)
    later = r.replan(joining, history, start_iteration=4, shard_positions={})
    assert later.placement[newcomer] == placed.placement[newcomer] and newcomer in later.meta["joiners"]
    assert newcomer not in state_senders(later, later.placement[newcomer])
    online = {**records, newcomer: dataclasses.replace(records[newcomer], state=PeerState.ONLINE)}
    assert newcomer not in r.replan(online, history, start_iteration=4, shard_positions={}).meta["joiners"]


def records_without(records: dict, peer: str) -> dict:
    return {p: rec for p, rec in records.items() if p != peer}


def test_a_joiner_of_a_stage_that_lost_every_peer_restarts_it_from_the_nearest_veteran_stage_0_too():
    """Stage 0 included: both holders died and a joining holder takes the stage over (it used to wait for a state
    nobody would send, then exit)."""
    def epoch(placement: dict[str, int]) -> Schedule:
        return Schedule(epoch=1, rules=PathRules(3, 3), placement=placement, memory=dict.fromkeys(placement, 2),
                        routes=())

    before = epoch({"h1": 0, "h2": 0, "a": 1, "b": 2, "c": 2})
    after = epoch({"new": 0, "a": 1, "b": 2, "j": 2, "k": 1})
    assert restore_sources(after, before, joiners=["new", "j", "k"]) == {"new": "a"}  # stage 1, 2 have veterans
    emptied = epoch({"new": 0, "b": 2, "k": 1})
    assert restore_sources(emptied, before, joiners=["new", "k"]) == {"new": "b", "k": "b"}
    assert restore_sources(after, None, joiners=["new"]) == {}  # the first epoch: nothing to restore
