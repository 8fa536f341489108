"""`render_text`: a monitor snapshot as a plain-text screen (peers, stage groups, schedule, recent iterations)."""

from __future__ import annotations

import time
from typing import Any

RECENT_ITERATIONS = 8


def short(peer_id: str) -> str:
    """A peer id cut to something a person can tell apart (the tail, as libp2p ids share their prefix)."""
    return "…" + peer_id[-8:] if len(peer_id) > 10 else peer_id


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def peer_lines(snapshot: dict[str, Any]) -> list[str]:
    lines = [f"{'peer':<10} {'stage':>5} {'state':<9} {'s/layer':>8} {'slots':>5} {'beat':>6} {'member':<6} address"]
    for p in snapshot["peers"]:
        mark = " GONE" if p["gone"] else " stale" if p["stale"] else ""
        stage = "coord" if p["role"] == "coordinator" else str(p["stage"]) + ("H" if p["data_holder"] else "")
        address = p["addresses"][0] if p["addresses"] else "-"
        member = "-" if p["role"] == "coordinator" else "yes" if p["member"] else "no"
        lines.append(f"{short(p['peer_id']):<10} {stage:>5} {p['state']:<9} {p['seconds_per_layer']:>8.4f} "
                     f"{p['memory_slots']:>5} {p['heartbeat_age']:>5.1f}s {member:<6} "
                     f"{address}{mark}")
    return lines


def schedule_lines(snapshot: dict[str, Any]) -> list[str]:
    s = snapshot["schedule"]
    if s is None:
        return ["schedule: none yet (the run is waiting for peers)"]
    groups = "  ".join(f"stage {stage}: {', '.join(short(p) for p in peers)}"
                       for stage, peers in s["stage_groups"].items())
    paths = sorted({tuple(p["stages"]) for p in s["paths"]})
    return [f"schedule epoch {s['epoch']} ({s['planner'] or 'planner?'}): {s['microbatches']} microbatches, "
            f"{len(paths)} distinct stage paths, planned iteration {_seconds(s['planned_iteration_s'])}",
            f"  {groups}"]


def iteration_lines(snapshot: dict[str, Any]) -> list[str]:
    rows = snapshot["iterations"][-RECENT_ITERATIONS:]
    if not rows:
        return ["iterations: none heard yet"]
    lines = [f"{'iter':>6} {'epoch':>5} {'loss':>8} {'tokens/s':>10} {'measured':>9} {'planned':>9}"]
    for r in rows:
        tps = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-"
        lines.append(f"{r['iteration']:>6} {r['epoch']:>5} {r['loss']:>8.4f} {tps:>10} "
                     f"{_seconds(r['iteration_seconds']):>9} {_seconds(r.get('planned_seconds')):>9}")
    return lines


def render_text(snapshot: dict[str, Any]) -> str:
    """The whole screen for `snapshot` (`swarm.monitor.snapshot.swarm_snapshot`)."""
    taken = time.strftime("%H:%M:%S", time.localtime(snapshot["taken_at"]))
    status = "finished" if snapshot["finished"] else "running"
    head = (f"run {snapshot['run_id']} ({status})  coordinator {short(snapshot['coordinator'])}  "
            f"{snapshot['live_peers']}/{sum(p['role'] == 'peer' for p in snapshot['peers'])} peers live  at {taken}")
    lines = [head, "", *peer_lines(snapshot), "", *schedule_lines(snapshot), "", *iteration_lines(snapshot)]
    lines += [f"! {p}" for p in snapshot["problems"]]
    return "\n".join(lines)
