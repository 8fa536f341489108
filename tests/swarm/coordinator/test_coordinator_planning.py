"""The coordinator plans with the configured method (SkipPipe or a baseline) on the peers' measured records,
and keeps that method when it re-plans after a departure."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler.profiles import swarm_from
from scheduler.schedule import validate
from swarm.coordinator.coordinator import Coordinator
from swarm.run_config import PLANNERS, RunConfig
from swarm.wire import PeerRecord, PeerState

N, STAGES = 12, 6


def records() -> dict[str, PeerRecord]:
    """12 peers whose measured links are those of the geo-distributed preset."""
    view = swarm_from("geo-distributed", N, seed=0)
    ids = [f"peer-{i:02d}" for i in range(N)]
    return {p: PeerRecord(peer_id=p, stage=-1, seconds_per_layer=0.05, memory_slots=3, state=PeerState.ONLINE,
                          links={q: (float(view.latency[i, j]), float(view.bandwidth[i, j]))
                                 for j, q in enumerate(ids) if j != i})
            for i, p in enumerate(ids)}


def coordinator(planner: str, *, rebalance: bool = True) -> Coordinator:
    config = RunConfig(run_id="plan-test", model="small", stages=STAGES, skip=0.33, microbatches=4, planner=planner,
                       rebalance=rebalance)
    config.validate()
    c = Coordinator.__new__(Coordinator)
    c.config, c.peer_id = config, "coordinator"
    c._init_state(run_dir=None, metrics_path=None)
    c.spec = config.to_spec(coordinator="coordinator", vocab_size=config.model_config(8192).vocab_size)
    return c


@pytest.mark.parametrize("planner", PLANNERS)
def test_each_planner_gives_a_valid_schedule_and_keeps_its_method_on_replanning(planner):
    c = coordinator(planner)
    peers = records()
    schedule = c.plan(peers, epoch=0, start_iteration=0)
    validate(schedule)
    expected = {"skippipe": "skippipe", "skippipe-no-collision": "skippipe_without_collision_awareness",
                "full-pipeline": "full_pipeline", "random-skip": "random_skip"}[planner]
    assert schedule.planner == expected and schedule.run_id == "plan-test"
    lengths = {len(r.stages) for r in schedule.routes}
    assert lengths == ({STAGES - 1} if planner == "full-pipeline" else {3})  # R = 4 of 6 stages with skip 0.33
    assert sum(len(schedule.routes_from(h)) for h in schedule.data_holders) == 4 * len(schedule.data_holders)
    c.schedule, c.schedules = schedule, [schedule]
    gone = next(p for p in schedule.placement if schedule.placement[p] == 3)
    again = c.replan({p: r for p, r in peers.items() if p != gone}, start_iteration=5)
    assert again.planner == expected and gone not in again.placement and again.epoch == 1
    # survivors keep their stages, but for a move into the shrunk group, which takes its state from a peer there
    moved = {p for p, s in schedule.placement.items() if p != gone and again.placement[p] != s}
    assert moved == set(again.meta["handover"]) and all(again.placement[p] == 3 for p in moved)
    assert all(schedule.placement[again.meta["handover"][p]] == 3 for p in moved)


def test_skippipe_beats_the_full_pipeline_on_the_geo_links():
    predicted = {}
    for planner in ("skippipe", "full-pipeline"):
        schedule = coordinator(planner).plan(records(), epoch=0, start_iteration=0)
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


def watch_publications(c: Coordinator, monkeypatch, peers: dict[str, PeerRecord]) -> list:
    """The schedules `c` publishes (kept as the real publish_schedule keeps them), on `peers` as the live ones."""
    published = []

    def publish(schedule):
        published.append(schedule)
        c.schedule = schedule
        c.schedules.append(schedule)

    monkeypatch.setattr(c, "_live_peers", lambda: peers)
    monkeypatch.setattr(c, "publish_schedule", publish)
    monkeypatch.setattr(c, "_publish", lambda topic, payload: c.notices.append(payload))
    c.notices = []
    return published


def test_a_gone_relay_replans_from_the_next_iteration_and_a_gone_holder_from_this_one(monkeypatch):
    from swarm.control.gossip import GossipMessage, membership_topic

    c = coordinator("skippipe")
    peers = records()
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 3
    relay = next(p for p, s in c.schedule.placement.items() if s == 2)
    live = {p: r for p, r in peers.items() if p != relay}
    published = watch_publications(c, monkeypatch, live)
    c._follow_membership(live)
    # the iteration in progress goes on with detours around the relay; peers are told it is gone
    assert published[-1].meta["start_iteration"] == 4 and relay not in published[-1].placement
    assert {"event": "gone", "peers": [relay], "iteration": 3} in c.notices
    # a microbatch it held cannot finish: its holder re-queues it, the iteration goes on
    say = lambda payload: c._handle(GossipMessage(topic=membership_topic("plan-test"), sender=next(iter(live)),  # noqa: E731
                                                  seqno=0, payload=payload))
    say({"event": "broken", "peer": "x", "iteration": 3, "epoch": 0, "microbatch": 1, "attempt": 0, "gone": relay})
    assert len(published) == 1
    # a holder that cannot re-queue one: that iteration runs again, under an epoch without the relay
    say({"event": "broken", "rerun": True, "peer": "x", "iteration": 3, "epoch": 0, "microbatch": 1})
    assert published[-1].meta["start_iteration"] == 3 and published[-1].epoch == 2
    assert relay not in published[-1].placement
    holder = c.schedule.data_holders[0]
    live = {p: r for p, r in live.items() if p != holder}
    watch_publications(c, monkeypatch, live)
    c._follow_membership(live)
    assert c.schedule.meta["start_iteration"] == 3  # a holder's microbatches cannot finish without it


def test_a_stuck_report_restarts_the_iteration_once_under_a_new_epoch(monkeypatch):
    from swarm.control.gossip import GossipMessage, membership_topic

    c = coordinator("skippipe")
    peers = records()
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 3
    published = watch_publications(c, monkeypatch, peers)
    member = next(iter(c.schedule.placement))

    def stuck(sender, iteration, epoch):
        c._handle(GossipMessage(topic=membership_topic("plan-test"), sender=sender, seqno=0,
                                payload={"event": "stuck", "peer": sender, "iteration": iteration, "epoch": epoch}))

    stuck("stranger", 3, 0)  # not a peer of the schedule
    stuck(member, 2, 0)  # an iteration already committed
    assert published == []
    stuck(member, 3, 0)
    stuck(member, 3, 0)  # reported twice (or by several peers): one restart
    assert len(published) == 1
    restart = published[0]
    assert restart.epoch == 1 and restart.meta["start_iteration"] == 3
    assert restart.placement == c.schedules[0].placement  # the same peers, nobody moved
    stuck(member, 3, 1)  # still stuck under the new epoch: restarted again
    assert len(published) == 2 and published[1].epoch == 2


def test_the_iteration_deadline_follows_measured_iteration_times():
    from swarm.peer.peer import MIN_ITERATION_DEADLINE, Peer, PeerOptions

    peer = Peer.__new__(Peer)
    peer.options = PeerOptions(initial_peers=(), identity_path="unused", iteration_deadline=300.0)
    peer.schedule = coordinator("skippipe").plan(records(), epoch=0, start_iteration=0)
    peer._commit_periods = []
    predicted = peer.schedule.predicted_iteration_seconds
    assert peer.iteration_deadline() == min(300.0, max(MIN_ITERATION_DEADLINE, 5 * predicted))
    peer._commit_periods = [20.0, 21.0, 19.0]
    assert peer.iteration_deadline() == 100.0  # five times the measured median
    peer._commit_periods = [200.0]
    assert peer.iteration_deadline() == 300.0  # never above the configured cap
    peer._commit_periods = [0.5]
    assert peer.iteration_deadline() == MIN_ITERATION_DEADLINE


def test_corroborated_unreachable_reports_declare_a_peer_gone_before_its_record_expires(monkeypatch):
    from types import SimpleNamespace

    from swarm.control.gossip import GossipMessage, membership_topic

    c = coordinator("skippipe")
    peers = records()
    ages = dict.fromkeys(peers, 1.0)  # every heartbeat fresh (period 5 s)
    c.records = SimpleNamespace(fetch_peers_with_age=lambda ttl: {p: (r, ages[p]) for p, r in peers.items()})
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules = [c.schedule]
    relay, a, b = [p for p, s in c.schedule.placement.items() if s != 0][:3]

    def unreachable(sender: str, target: str) -> None:
        c._handle(GossipMessage(topic=membership_topic("plan-test"), sender=sender, seqno=0,
                                payload={"event": "unreachable", "peer": target}))

    unreachable(a, relay)  # one report while its heartbeat is fresh: one broken link is no proof
    unreachable("stranger", relay)  # not a peer of the schedule: does not count
    assert relay in c._live_peers()
    ages[relay] = 4.0  # its heartbeat is now overdue (2 periods of 2 s): the report stands corroborated
    assert relay not in c._live_peers()
    c._records[relay] = dataclasses.replace(peers[relay], state=PeerState.JOINING)
    ages[relay] = 1.0
    peers[relay] = c._records[relay]
    assert relay in c._live_peers()  # it was alive after all and asks to be placed again
    unreachable(a, b)
    unreachable(relay, b)  # two reporters: gone at once, whatever its heartbeat says
    assert b not in c._live_peers()


def test_a_lone_stages_peer_leaving_gracefully_is_replaced_by_a_moved_peer_without_any_detour(monkeypatch):
    c = coordinator("skippipe")
    peers = records()
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 3
    placement = dict(c.schedule.placement)
    lone = next((p for p, s in placement.items() if s > 0 and len(c.schedule.stage_peers(s)) == 1), None)
    if lone is None:  # make one: every other peer of some stage leaves first (plain departures)
        stage = max(range(1, STAGES), key=lambda s: -len(c.schedule.stage_peers(s)))
        lone, *others = c.schedule.stage_peers(stage)
        live = {p: r for p, r in peers.items() if p not in others}
        watch_publications(c, monkeypatch, live)
        c._follow_membership(live)
        peers = live
    stage = c.schedule.placement[lone]
    draining = {**peers, lone: dataclasses.replace(peers[lone], state=PeerState.DRAINING)}
    published = watch_publications(c, monkeypatch, draining)
    c._follow_membership(draining)
    new = published[-1]
    assert lone not in new.placement and new.meta["start_iteration"] == 4  # the iteration in progress goes on
    assert not any(n.get("event") == "gone" for n in c.notices)  # nobody detours around a peer still serving
    (mover, source), = new.meta["handover"].items()
    assert source == lone and new.placement[mover] == stage
    before = c.schedules[-2].placement
    assert len([p for p in before if before[p] == before[mover]]) >= 2  # its old stage keeps a peer
    assert all(new.placement[p] == s for p, s in before.items() if p not in (lone, mover))  # nobody else moves
    validate(new, balance_tolerance=None)
    c._follow_membership(draining)  # the same view again: no further epoch
    assert published[-1] is new


def test_a_stopped_coordinator_tells_the_peers_the_run_is_over_but_a_leaving_scheduler_role_does_not():
    import threading
    from types import SimpleNamespace

    stop = threading.Event()
    stop.set()
    for options, told in ((SimpleNamespace(), True), (None, False)):  # the coordinator process; a peer's role
        c = coordinator("skippipe")
        c.options, c._gossip, c.notices = options, object(), []
        c._publish = lambda topic, payload, c=c: c.notices.append(payload)
        c.finish(stop)
        assert c.notices == ([{"event": "finished", "iterations": 0, "stopped": True}] if told else [])


def test_a_broken_microbatch_convicts_the_peer_reported_unreachable_and_a_rerun_leaves_it_out(monkeypatch):
    from types import SimpleNamespace

    from swarm.control.gossip import GossipMessage, membership_topic

    c = coordinator("skippipe")
    peers = records()
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 3
    relay, reporter = [p for p, s in c.schedule.placement.items() if s != 0][:2]
    ages = dict.fromkeys(peers, 0.5)  # its heartbeat still looks fresh: one report alone would not convict it
    c.records = SimpleNamespace(fetch_peers_with_age=lambda ttl: {p: (r, ages[p]) for p, r in peers.items()})
    published = []
    monkeypatch.setattr(c, "publish_schedule", lambda s: (published.append(s), setattr(c, "schedule", s),
                                                          c.schedules.append(s)))

    def say(payload):
        c._handle(GossipMessage(topic=membership_topic("plan-test"), sender=reporter, seqno=0, payload=payload))

    say({"event": "unreachable", "peer": relay})
    assert relay in c._live_peers() and not published
    # the microbatch it broke is re-queued by its holder; the relay is taken for gone at once
    say({"event": "broken", "peer": reporter, "iteration": 3, "epoch": 0, "microbatch": 2, "attempt": 0,
         "gone": relay})
    assert relay not in c._live_peers() and not published
    # a holder that could not re-queue one asks for the iteration again: without the relay
    say({"event": "broken", "rerun": True, "peer": reporter, "iteration": 3, "epoch": 0, "microbatch": 2})
    assert len(published) == 1 and published[0].meta["start_iteration"] == 3 and relay not in published[0].placement


def test_a_joiner_is_placed_once_probed_and_restores_a_lost_data_holder_from_this_iteration(monkeypatch):
    c = coordinator("skippipe", rebalance=False)  # survivors stay put: the lost holder's shard is carried
    peers = records()
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 3
    assert c.schedule.meta["shards"] == {h: [i] for i, h in enumerate(c.schedule.data_holders)}
    holder = c.schedule.data_holders[1]
    live = {p: r for p, r in peers.items() if p != holder}
    published = watch_publications(c, monkeypatch, live)
    c._follow_membership(live)
    carried = published[-1].meta["shards"]
    assert holder not in carried and sorted(k for ks in carried.values() for k in ks) == [0, 1, 2]
    carrier = next(h for h, ks in carried.items() if len(ks) == 2)
    assert len(published[-1].routes_from(carrier)) == 8  # it injects its own microbatches and the lost shard's

    # a volunteer announces itself: not placed before its record shows its first round of link probes
    c.completed = 5
    newcomer = dataclasses.replace(peers[holder], peer_id="peer-new", state=PeerState.JOINING, links={})
    live = {**live, "peer-new": newcomer}
    published = watch_publications(c, monkeypatch, live)
    # settled, not yet past the probe wait
    monkeypatch.setattr("swarm.coordinator.coordinator.time.monotonic", lambda: 10.0)
    c._first_seen["peer-new"] = 0.0
    c._follow_membership(live)
    assert not published
    live["peer-new"] = dataclasses.replace(newcomer, links=peers[holder].links)
    c._follow_membership(live)
    schedule = published[-1]
    # it becomes a data holder and takes the carried shard over, rerunning the iteration in progress so that the
    # shard's position is the one of the last commit
    assert schedule.placement["peer-new"] == 0 and schedule.meta["start_iteration"] == 5
    assert len(schedule.meta["shards"]["peer-new"]) == 1 and len(schedule.meta["shards"][carrier]) == 1
    assert {h: len(schedule.routes_from(h)) for h in schedule.data_holders} == dict.fromkeys(schedule.data_holders, 4)
    validate(schedule, balance_tolerance=None)


def test_a_joiner_with_its_own_documents_is_not_handed_a_carried_shard(monkeypatch):
    c = coordinator("skippipe", rebalance=False)  # survivors stay put: the lost holder's shard is carried
    peers = records()
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 2
    gone = c.schedule.data_holders[0]
    live = {p: r for p, r in peers.items() if p != gone}
    published = watch_publications(c, monkeypatch, live)
    c._follow_membership(live)
    carrier = next(h for h, ks in published[-1].meta["shards"].items() if len(ks) == 2)
    # a volunteer with its own documents (--data) joins: a data holder, but it draws from them only
    c.completed = 4
    own = dataclasses.replace(peers[gone], peer_id="peer-own", state=PeerState.JOINING, data_holder=True)
    live = {**live, "peer-own": own}
    c._first_seen["peer-own"] = -100.0
    c._follow_membership(live)
    schedule = published[-1]
    assert schedule.placement["peer-own"] == 0 and schedule.meta["shards"].get("peer-own", []) == []
    assert len(schedule.meta["shards"][carrier]) == 2 and schedule.meta["start_iteration"] == 5
    # a plain volunteer joins next: it becomes the carried shard's holder
    c.completed = 6
    plain = dataclasses.replace(peers[gone], peer_id="peer-plain", state=PeerState.JOINING)
    live = {**live, "peer-plain": plain}
    c._first_seen["peer-plain"] = -100.0
    c._follow_membership(live)
    schedule = published[-1]
    assert schedule.placement["peer-plain"] == 0 and len(schedule.meta["shards"]["peer-plain"]) == 1
    assert len(schedule.meta["shards"][carrier]) == 1 and schedule.meta["start_iteration"] == 6


def test_a_lost_data_holder_is_refilled_by_a_survivor_that_takes_the_carried_shard_over(monkeypatch):
    """Without the move one holder carries two shards (twice the injections and loss steps) until a volunteer
    joins; the move buys most of that back at once, and the mover gets stage 0's state from a holder."""
    plans = {}
    for rebalance in (False, True):
        c = coordinator("skippipe", rebalance=rebalance)
        peers = records()
        c.schedule = c.plan(peers, epoch=0, start_iteration=0)
        c.schedules, c.completed = [c.schedule], 3
        first, gone = c.schedule, c.schedule.data_holders[1]
        live = {p: r for p, r in peers.items() if p != gone}
        published = watch_publications(c, monkeypatch, live)
        c._follow_membership(live)
        plans[rebalance] = published[-1]
    carried, moved = plans[False], plans[True]
    assert not carried.meta["handover"] and any(len(ks) == 2 for ks in carried.meta["shards"].values())
    (mover, source), = moved.meta["handover"].items()
    assert moved.placement[mover] == 0 and first.placement[mover] != 0 and first.placement[source] == 0
    assert len(first.stage_peers(first.placement[mover])) >= 2  # its old group keeps a peer
    assert all(moved.placement[p] == s for p, s in first.placement.items() if p not in (gone, mover))
    assert sorted(k for ks in moved.meta["shards"].values() for k in ks) == [0, 1, 2]
    assert {h: len(moved.routes_from(h)) for h in moved.data_holders} == dict.fromkeys(moved.data_holders, 4)
    assert moved.meta["start_iteration"] == 3  # the shard changes hands at the last commit's position
    assert moved.predicted_iteration_seconds < 0.9 * carried.predicted_iteration_seconds
    validate(moved, balance_tolerance=None)


@pytest.mark.parametrize("planner", ["skippipe", "full-pipeline"])
def test_a_stage_that_lost_every_peer_is_skipped_by_skippipe_and_refilled_for_the_full_pipeline(planner, monkeypatch):
    c = coordinator(planner, rebalance=False)
    peers = records()
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 3
    first, stage = c.schedule, 2
    gone = first.stage_peers(stage)
    live = {p: r for p, r in peers.items() if p not in gone}
    published = watch_publications(c, monkeypatch, live)
    c._follow_membership(live)
    new = published[-1]
    if planner == "skippipe":  # paths route around the empty stage until a volunteer takes it over
        assert new.rules.unserved == {stage} and stage not in new.placement.values()
        assert not new.meta["restore"] and all(new.placement[p] == s for p, s in first.placement.items() if p in live)
        return
    # a full pipeline cannot skip it: a survivor moves there and restarts it from a neighbouring stage's peer
    (mover,) = [p for p in live if new.placement[p] != first.placement[p]]
    assert new.placement[mover] == stage and not new.rules.unserved
    assert abs(new.placement[new.meta["restore"][mover]] - stage) == 1 and not new.meta["handover"]
    assert {len(r.stages) for r in new.routes} == {STAGES - 1}


def test_a_joiner_whose_epoch_has_not_started_is_neither_moved_nor_a_source_of_state(monkeypatch):
    """A holder dies while a joiner's first epoch waits for the next iteration: the rerun of the iteration in
    progress must not move the joiner (it does not hold its stage yet, and waits for that stage's state)."""
    c = coordinator("skippipe")
    peers = records()
    newcomer = "peer-11"
    first = {p: r for p, r in peers.items() if p != newcomer}
    c.schedule = c.plan(first, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 3
    c._first_seen[newcomer] = -100.0
    live = {**first, newcomer: dataclasses.replace(peers[newcomer], state=PeerState.JOINING)}
    published = watch_publications(c, monkeypatch, live)
    c._follow_membership(live)
    joined = published[-1]
    assert joined.meta["start_iteration"] == 4 and newcomer in joined.meta["joiners"]
    holder = joined.data_holders[0]
    live = {p: r for p, r in live.items() if p != holder}
    c._follow_membership(live)
    rerun = published[-1]
    assert rerun.meta["start_iteration"] == 3 and rerun.placement[newcomer] == joined.placement[newcomer]
    assert newcomer not in rerun.meta["handover"] and newcomer not in rerun.meta["handover"].values()
    # a mover's state comes from a peer that held the stage when the iteration in progress began
    assert all(c.schedules[0].placement.get(src) == rerun.placement[p] for p, src in rerun.meta["handover"].items())


def test_a_saved_plan_starts_the_run_once_its_peers_are_live_and_a_fresh_plan_otherwise():
    from scheduler.schedule import Schedule
    from swarm.coordinator.coordinator import LINK_WAIT_SECONDS, CoordinatorOptions

    peers = records()
    earlier = coordinator("full-pipeline").plan(peers, epoch=3, start_iteration=40)
    saved = Schedule.from_json(earlier.to_json())  # as `--first-schedule` reads it
    c = coordinator("full-pipeline")
    c.options = CoordinatorOptions(config=c.config, identity_path="", first_schedule=saved)
    started = c._first_plan(peers, settled=3.0)
    assert started.placement == earlier.placement and started.routes == earlier.routes
    assert started.epoch == 0 and started.meta["start_iteration"] == 0 and started.meta["saved_plan"]
    # the run's shards, one per holder, held by the holders its columns start at (the others inject nothing)
    shards = started.meta["shards"]
    assert set(shards) == set(earlier.data_holders) and started.meta["shard_positions"] == {}
    assert sorted(k for ks in shards.values() for k in ks) == list(range(len(earlier.data_holders)))
    assert {h for h, ks in shards.items() if ks} == {r.origin for r in started.routes}
    # one of its peers not here yet: wait for it, then plan afresh for those who are
    late = sorted(peers)[5]
    fewer = {p: r for p, r in peers.items() if p != late}
    assert c._first_plan(fewer, settled=3.0) is None
    fresh = c._first_plan(fewer, settled=LINK_WAIT_SECONDS)
    assert late not in fresh.placement and "saved_plan" not in fresh.meta
    # a peer pinning another stage than the plan gives it: no waiting, a fresh plan that keeps its pin
    pinned = sorted(peers)[7]
    other = (earlier.placement[pinned] + 1) % STAGES
    moved = {**peers, pinned: dataclasses.replace(peers[pinned], stage=other)}
    fresh = c._first_plan(moved, settled=3.0)
    assert fresh.placement[pinned] == other and "saved_plan" not in fresh.meta


def test_a_saved_plan_of_another_method_or_shape_is_refused():
    from swarm.coordinator.coordinator import saved_plan_mismatch

    saved = coordinator("full-pipeline").plan(records(), epoch=0, start_iteration=0)
    assert saved_plan_mismatch(saved, coordinator("full-pipeline").config) is None
    assert "'full_pipeline' planner" in saved_plan_mismatch(saved, coordinator("skippipe").config)
    three = dataclasses.replace(coordinator("full-pipeline").config, stages=3)
    assert "6 stages, the run 3" in saved_plan_mismatch(saved, three)


def test_a_full_pipeline_places_a_joiner_where_its_columns_lost_a_peer():
    c = coordinator("full-pipeline")
    pins = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]  # two columns, every peer in one
    peers = {p: dataclasses.replace(r, stage=pins[i]) for i, (p, r) in enumerate(sorted(records().items()))}
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules = [c.schedule]
    assert len({r.peers for r in c.schedule.routes}) == 2
    victim = sorted(peers)[6]  # a stage 3 peer: one column is left
    live = {p: dataclasses.replace(r, stage=-1) for p, r in peers.items() if p != victim}
    c.schedule = c.replan(live, start_iteration=4)
    c.schedules.append(c.schedule)
    assert len({r.peers for r in c.schedule.routes}) == 1
    newcomer = dataclasses.replace(peers[victim], peer_id="newcomer", stage=-1, state=PeerState.JOINING)
    joined = c.replan({**live, "newcomer": newcomer}, start_iteration=8)
    assert joined.placement["newcomer"] == 3
    assert len({r.peers for r in joined.routes}) == 2
