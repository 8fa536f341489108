"""Round trips: how long, in the plan, a peer waits for each microbatch it sent on to come back.

A peer that sends a microbatch's forward keeps its activations until the backward returns. The schedule's own
simulation (on the cost tables it carries) says when that should be, queueing at the peers downstream included;
a peer waiting much longer than planned has reason to check on the peer it sent to. These are the base of the
runtime's per-hop deadlines (`swarm.peer.pipeline`), derived from measured costs rather than fixed constants.
"""

from __future__ import annotations

from scheduler.costs import CostTables, tables_from_dict
from scheduler.schedule import Schedule
from scheduler.simulator import BACKWARD, FORWARD, SimRoute, simulate


def schedule_sim_routes(schedule: Schedule, tables: CostTables) -> list[SimRoute]:
    """The schedule's routes as the simulator takes them (peer indices of `tables`, stage 0 first)."""
    idx = {pid: i for i, pid in enumerate(tables.ids)}
    return [SimRoute(r.microbatch, tuple(idx[p] for p in r.nodes), (0, *r.stages), r.inject_after)
            for r in schedule.routes]


def round_trips(schedule: Schedule, tables: CostTables | None = None) -> dict[tuple[str, int], float]:
    """(peer, microbatch) -> simulated seconds from the end of that peer's forward (a data holder's injection) of
    the microbatch to the arrival of its backward there. Empty when the schedule carries no costs."""
    if tables is None:
        if "costs" not in schedule.meta:
            return {}
        tables = tables_from_dict(schedule.meta["costs"])
    result = simulate(tables, schedule_sim_routes(schedule, tables), record_ops=True)
    sent = {(op.node, op.microbatch): op.end for op in result.ops if op.kind == FORWARD}
    return {(tables.ids[op.node], op.microbatch): op.arrived - sent[(op.node, op.microbatch)]
            for op in result.ops if op.kind == BACKWARD and (op.node, op.microbatch) in sent}
