"""What an onlooker knows of a run at one moment, as plain JSON-ready data: `swarm_snapshot`.

Built only from what the run already publishes: the coordinator's signed run spec, the peers' self-signed records
(with their age), the scheduler's signed schedule, and the progress lines rebuilt from gossip. Peers seen before but
whose record has since expired stay listed, marked `gone`, so a death shows instead of a row silently vanishing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.schedule import Schedule
from swarm.control.membership import cert_problem
from swarm.wire import PeerRecord, RunSpec

SNAPSHOT_VERSION = 1
"""Bumped when a field of the snapshot changes meaning (scripts read `--once --json`)."""


@dataclass(frozen=True)
class PeerSighting:
    """A peer's newest record and when the onlooker last saw it live (unix seconds)."""

    record: PeerRecord
    age: float
    """Seconds since the peer published it (its heartbeat's age) when it was read."""
    seen_at: float
    live: bool
    """Its record was in the DHT at the last read."""


def peer_row(s: PeerSighting, *, run_id: str, coordinator: str, issuers: Iterable[str], placed: Mapping[str, int],
             now: float, stale_after: float, dht_now: float) -> dict[str, Any]:
    """One peer's row: what it announces, whether the run admitted it, and how fresh that is. The coordinator's own
    record is listed too, with the role `coordinator` (it needs no membership)."""
    r = s.record
    age = s.age + (now - s.seen_at)
    role = "coordinator" if r.peer_id == coordinator else "peer"
    why_not = None if role == "coordinator" else \
        cert_problem(r.cert, peer=r.peer_id, run=run_id, issuers=set(issuers), now=dht_now)
    return {
        "peer_id": r.peer_id,
        "role": role,
        "stage": r.stage,
        "placed_stage": placed.get(r.peer_id),
        "state": r.state.name.lower(),
        "data_holder": r.data_holder,
        "seconds_per_layer": r.seconds_per_layer,
        "loss_seconds": r.loss_seconds,
        "memory_slots": r.memory_slots,
        "addresses": list(r.addresses),
        "reachability": r.reachability or "unknown",
        "member": why_not is None,
        "member_problem": why_not,
        "heartbeat_age": round(age, 2),
        "stale": (not s.live) or age > stale_after,
        "gone": not s.live,
    }


def link_rows(records: Iterable[PeerRecord]) -> list[dict[str, Any]]:
    """Every measured link, as its measurer announced it: latency in seconds, goodput in bytes/s."""
    return [{"from": r.peer_id, "to": other, "latency_s": lat, "bytes_per_s": bw}
            for r in records for other, (lat, bw) in sorted(r.links.items())]


def schedule_view(schedule: Schedule | None, *, max_paths: int = 256) -> dict[str, Any] | None:
    """The schedule epoch's groups, planned iteration and (up to `max_paths`) microbatch paths."""
    if schedule is None:
        return None
    groups: dict[str, list[str]] = {}
    for peer, stage in sorted(schedule.placement.items(), key=lambda kv: (kv[1], kv[0])):
        groups.setdefault(str(stage), []).append(peer)
    return {
        "epoch": schedule.epoch,
        "planner": schedule.planner,
        "planned_iteration_s": schedule.predicted_iteration_seconds,
        "stage_groups": groups,
        "data_holders": list(schedule.data_holders),
        "microbatches": len(schedule.routes),
        "paths": [{"microbatch": r.microbatch, "origin": r.origin, "stages": list(r.stages), "peers": list(r.peers)}
                  for r in schedule.routes[:max_paths]],
    }


def swarm_snapshot(*, run_id: str, coordinator: str, spec: RunSpec | None, sightings: Mapping[str, PeerSighting],
                   schedule: Schedule | None, progress: Iterable[dict], finished: bool, stale_after: float,
                   dht_now: float, problems: Iterable[str] = (), now: float | None = None) -> dict[str, Any]:
    """The whole view, JSON-ready. `problems`: what went wrong reading it (a DHT timeout, say), for the reader."""
    now = time.time() if now is None else now
    issuers = {coordinator, *(schedule.meta.get("successors", []) if schedule is not None else [])}
    placed = dict(schedule.placement) if schedule is not None else {}
    peers = [peer_row(s, run_id=run_id, coordinator=coordinator, issuers=issuers, placed=placed, now=now,
                      stale_after=stale_after, dht_now=dht_now)
             for _, s in sorted(sightings.items(), key=lambda kv: (kv[1].record.stage, kv[0]))]
    return {
        "version": SNAPSHOT_VERSION,
        "run_id": run_id,
        "coordinator": coordinator,
        "taken_at": round(now, 3),
        "run": None if spec is None else {"model": spec.model, "stages": spec.stages, "skip": spec.skip_ratio,
                                          "admission": spec.admission},
        "finished": finished,
        "peers": peers,
        "live_peers": sum(not p["stale"] for p in peers if p["role"] == "peer"),
        "schedule": schedule_view(schedule),
        "iterations": list(progress),
        "links": link_rows(s.record for s in sightings.values() if s.live),
        "problems": list(problems),
    }


def json_ready(value: Any) -> Any:
    """`value` with every non-finite float (a diverged loss) as None, so strict JSON readers take it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
