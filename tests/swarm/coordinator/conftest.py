"""Shared builders for the scheduler's unit tests: a run config, the geo-distributed peers' records."""

from __future__ import annotations

import pytest

from scheduler.profiles import swarm_from
from swarm.coordinator.replanner import Replanner
from swarm.coordinator.scheduler import Scheduler
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord, PeerState

N, STAGES = 12, 6


def make_records() -> dict[str, PeerRecord]:
    """12 peers whose measured links are those of the geo-distributed preset."""
    view = swarm_from("geo-distributed", N, seed=0)
    ids = [f"peer-{i:02d}" for i in range(N)]
    return {p: PeerRecord(peer_id=p, stage=-1, seconds_per_layer=0.05, memory_slots=3, state=PeerState.ONLINE,
                          links={q: (float(view.latency[i, j]), float(view.bandwidth[i, j]))
                                 for j, q in enumerate(ids) if j != i})
            for i, p in enumerate(ids)}


def make_config(planner: str = "skippipe", *, rebalance: bool = True, **kwargs) -> RunConfig:
    config = RunConfig(run_id="plan-test", model="small", stages=STAGES, skip=0.33, microbatches=4, planner=planner,
                       rebalance=rebalance, **kwargs)
    config.validate()
    return config


def model_of(config: RunConfig) -> dict:
    return config.to_spec(coordinator="coordinator", vocab_size=config.model_config(8192).vocab_size).model


def make_replanner(planner: str = "skippipe", **kwargs) -> Replanner:
    config = make_config(planner, **kwargs)
    return Replanner(config, model_of(config))


def make_scheduler(planner: str = "skippipe", *, rebalance: bool = True, measured_speeds: bool = False,
                   link_drift: bool = True, **kwargs) -> Scheduler:
    config = make_config(planner, rebalance=rebalance, measured_speeds=measured_speeds, link_drift=link_drift)
    return Scheduler(config, model_of(config), "coordinator", **kwargs)


@pytest.fixture
def records() -> dict[str, PeerRecord]:
    return make_records()


def read_after_expiry(s: Scheduler, live: dict[str, PeerRecord], now: float, age: float = 0.5) -> list:
    """What `s` does with a read at `now` showing only `live`, the placed peers missing from it dead long enough for
    their records to have run out: an earlier read missed them and the scheduler pinged them (`Liveness.unread`: a
    record is taken for a death only once a ping since it was last heard from went unanswered), and none answered."""
    read = {p: (r, age) for p, r in live.items()}
    s.observe(read, now - s.suspicions.pings.timeout - 1.0)
    s.check_pings(now - 0.5)
    return s.observe(read, now)
