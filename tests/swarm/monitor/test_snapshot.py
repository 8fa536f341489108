"""swarm_snapshot and render_text: the onlooker's view built from real signed records and a real schedule."""

from __future__ import annotations

import json
import math

import pytest

from scheduler.planner import plan_for_profile
from swarm.control.membership import MembershipCert
from swarm.monitor.snapshot import PeerSighting, json_ready, swarm_snapshot
from swarm.monitor.terminal import render_text
from swarm.net.identity import ensure_identity, load_identity
from swarm.wire import PeerRecord, PeerState

RUN = "watched"
NOW = 1_000_000.0


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return [load_identity(str(d / f"{i}.key")) for i in range(4) if ensure_identity(str(d / f"{i}.key"))]


def sighting(record: PeerRecord, *, age: float = 1.0, live: bool = True) -> PeerSighting:
    return PeerSighting(record=record, age=age, seen_at=NOW, live=live)


def record(identity, stage: int, *, cert: bytes = b"", links=None, reachability: str = "") -> PeerRecord:
    return PeerRecord(peer_id=identity.peer_id, stage=stage, seconds_per_layer=0.01, memory_slots=3,
                      links=links or {}, addresses=(f"/ip4/10.0.0.1/tcp/4000/p2p/{identity.peer_id}",),
                      state=PeerState.ONLINE, data_holder=stage == 0, cert=cert, reachability=reachability)


def test_peers_roles_membership_freshness_and_links(keys):
    coordinator, member, stranger, dead = keys
    cert = MembershipCert.issue(coordinator, member.peer_id, RUN, NOW + 60).to_msgpack()
    forged = MembershipCert.issue(stranger, stranger.peer_id, RUN, NOW + 60).to_msgpack()
    sightings = {
        coordinator.peer_id: sighting(record(coordinator, -1)),
        member.peer_id: sighting(record(member, 0, cert=cert, links={stranger.peer_id: (0.02, 5e7)},
                                        reachability="relayed")),
        stranger.peer_id: sighting(record(stranger, 1, cert=forged), age=30.0),
        dead.peer_id: sighting(record(dead, 1, cert=cert), live=False),
    }
    snap = swarm_snapshot(run_id=RUN, coordinator=coordinator.peer_id, spec=None, sightings=sightings, schedule=None,
                          progress=[], finished=False, stale_after=5.0, dht_now=NOW, now=NOW)
    rows = {p["peer_id"]: p for p in snap["peers"]}
    assert rows[coordinator.peer_id]["role"] == "coordinator"
    assert rows[member.peer_id]["member"] and not rows[member.peer_id]["stale"]
    assert rows[member.peer_id]["reachability"] == "relayed" and rows[dead.peer_id]["reachability"] == "unknown"
    assert not rows[stranger.peer_id]["member"] and "does not admit" in rows[stranger.peer_id]["member_problem"]
    assert rows[stranger.peer_id]["stale"] and not rows[stranger.peer_id]["gone"]  # 30 s without a beat
    assert rows[dead.peer_id]["gone"] and rows[dead.peer_id]["stale"]
    assert not rows[dead.peer_id]["member"]  # the certificate names someone else
    assert snap["live_peers"] == 1
    assert snap["links"] == [{"from": member.peer_id, "to": stranger.peer_id, "latency_s": 0.02,
                              "bytes_per_s": 5e7}]
    assert snap["schedule"] is None
    text = render_text(snap)
    assert "GONE" in text and "stale" in text and "schedule: none yet" in text


def test_the_schedule_groups_paths_and_progress_are_shown(keys):
    schedule = plan_for_profile("single-cluster", num_peers=6, num_stages=3, skip=0.33, iterations=50)
    sightings = {p: sighting(PeerRecord(peer_id=p, stage=s, seconds_per_layer=0.01, memory_slots=3))
                 for p, s in schedule.placement.items()}
    line = {"iteration": 7, "epoch": schedule.epoch, "loss": math.nan, "tokens_per_s": 1000.0,
            "iteration_seconds": 1.2, "planned_seconds": 1.0}
    snap = swarm_snapshot(run_id=RUN, coordinator=keys[0].peer_id, spec=None, sightings=sightings,
                          schedule=schedule, progress=[line], finished=True, stale_after=5.0, dht_now=NOW, now=NOW)
    view = snap["schedule"]
    assert view["epoch"] == schedule.epoch and view["microbatches"] == len(schedule.routes)
    assert sorted(p for group in view["stage_groups"].values() for p in group) == sorted(schedule.placement)
    assert all(p["placed_stage"] == schedule.placement[p["peer_id"]] for p in snap["peers"])
    text = render_text(snap)
    assert "(finished)" in text and f"schedule epoch {schedule.epoch}" in text and "nan" in text
    strict = json.dumps(json_ready(snap), allow_nan=False)  # a diverged loss is null, not NaN
    assert json.loads(strict)["iterations"][0]["loss"] is None
