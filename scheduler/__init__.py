"""The planning brain of skippipe: pure, deterministic, no torch and no networking.

The code is organized as follows:
- constants.py: values shared by the planner and the runtime (memory slots, reorder bounds, overheads)
- path_rules.py: `PathRules`, the convergence constraints on one microbatch's path, and their checks
- swarm_view.py: `PeerSpec`, `ModelCost`, `SwarmView`: peers, links and the model as the planner sees them
- costs.py: `CostTables`, the per-peer forward times and per-link message times one plan is made for
- profiles.py: network presets (geo-distributed, 5-clusters, single-cluster), a seeded random swarm, files
- instance.py: reference-style instances (a measured link matrix in seconds) and the bundled reference
- placement.py: peer -> stage assignment, from scratch and incrementally after joins and departures
- paths.py: the SkipPipe path planner (priority planning, then local search on the simulated makespan)
- baselines.py: the DT-FM full pipeline and network-oblivious random skip
- swarm_balance.py: SWARM-style placement by throughput and rebalancing toward the bottleneck stage
- swarm_wiring.py: SWARM-style stochastic wiring (each hop's peer drawn in proportion to its throughput)
- swarm_tuning.py: the SWARM baseline's own best placement (its throughput balance tuned on the simulator)
- detour.py: how a microbatch in flight goes around a gone peer, and which detours a receiver accepts
- simulator.py: discrete-event simulation of one iteration (makespan, busy time, collisions, memory)
- expected_makespan.py: the iteration a schedule can expect when message times jitter as measured
- round_trips.py: how long, in the plan, a peer waits for a microbatch it sent on to come back (per-hop deadlines)
- gantt.py: a Gantt chart PNG of a simulated iteration
- schedule.py: `Schedule` and `Route`, the versioned plan peers execute, and its validator
- planner.py: `plan()`, the one call that places peers and plans paths for a swarm view
"""

import importlib
from typing import Any

_EXPORTS = {
    "PathRules": "path_rules", "path_violation": "path_rules", "valid_stage_sequences": "path_rules",
    "Route": "schedule", "Schedule": "schedule", "ScheduleError": "schedule", "validate": "schedule",
    "ModelCost": "swarm_view", "PeerSpec": "swarm_view", "SwarmView": "swarm_view",
}
"""Names this package exports, and their module. They are imported on first use (PEP 562), so that a process
that needs only `scheduler.constants` (a gossip sidecar, through `swarm.constants`) does not import numpy."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    return getattr(importlib.import_module(f"scheduler.{module}"), name)
