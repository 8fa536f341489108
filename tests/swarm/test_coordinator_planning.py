"""The coordinator plans with the configured method (SkipPipe or a baseline) on the peers' measured records,
and keeps that method when it re-plans after a departure."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.profiles import swarm_from
from scheduler.schedule import validate
from swarm.coordinator import Coordinator
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


def coordinator(planner: str) -> Coordinator:
    config = RunConfig(run_id="plan-test", model="small", stages=STAGES, skip=0.33, microbatches=4, planner=planner)
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
    assert all(again.placement[p] == s for p, s in schedule.placement.items() if p != gone)


def test_skippipe_beats_the_full_pipeline_on_the_geo_links():
    predicted = {}
    for planner in ("skippipe", "full-pipeline"):
        schedule = coordinator(planner).plan(records(), epoch=0, start_iteration=0)
        predicted[planner] = schedule.predicted_iteration_seconds
        assert np.isfinite(predicted[planner])
    assert predicted["skippipe"] < 0.75 * predicted["full-pipeline"]


def test_an_unknown_planner_is_refused():
    with pytest.raises(ValueError, match="swarm.planner"):
        RunConfig.from_tables({"swarm": {"planner": "fastest"}})


def test_a_stuck_report_restarts_the_iteration_once_under_a_new_epoch(monkeypatch):
    from swarm.gossip import GossipMessage, membership_topic

    c = coordinator("skippipe")
    peers = records()
    c.schedule = c.plan(peers, epoch=0, start_iteration=0)
    c.schedules, c.completed = [c.schedule], 3
    published = []
    monkeypatch.setattr(c, "_live_peers", lambda: peers)
    monkeypatch.setattr(c, "publish_schedule", lambda s: (published.append(s), setattr(c, "schedule", s)))
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
    from swarm.peer import MIN_ITERATION_DEADLINE, Peer, PeerOptions

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
