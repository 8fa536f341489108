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
