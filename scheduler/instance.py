"""Reference-style instances: a cluster someone measured, given as a link matrix in seconds.

The format is the one of the SkipPipe reference (`tests/assets/reference-geo20.json`): `link_seconds`
(one message's cost between every pair of nodes, overhead included), `forward_seconds` (one number or one
per node), `memory`, `microbatches_per_data_node`, `stages_per_path`, optional `backward_factor`,
`loss_factor` and `partitions` (node indices per stage, stage 0 = data holders). Without `partitions`
the file must say `num_stages` and `data_holders`, and the planner places the other nodes.

The reference's own path sets and their injection pattern are reproduced here so the simulator can be
checked against the reference simulator's makespans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.constants import BACKWARD_FACTOR, LOSS_FACTOR, MAX_PEERS, MAX_STAGES
from scheduler.costs import CostTables
from scheduler.simulator import SimRoute

REFERENCE_OP_GAP = 0.13
"""The reference simulator keeps a node busy this long after each operation..."""
REFERENCE_INJECT_GAP = 0.09
"""...and this long after injecting a microbatch."""


@dataclass(frozen=True)
class Instance:
    """A measured cluster: cost tables plus what the run asks for."""

    tables: CostTables
    microbatches_per_holder: int
    stages_per_path: int
    num_stages: int
    data_holders: tuple[int, ...]
    partitions: tuple[tuple[int, ...], ...] | None
    raw: dict[str, Any]


class InstanceError(ValueError):
    """A malformed instance file."""


def load_instance(path: str | Path, *, reference_gaps: bool = False) -> Instance:
    """Read and check an instance file; raises InstanceError naming the bad field."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise InstanceError(f"cannot read instance {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise InstanceError(f"instance {path} is not valid JSON: {e}") from None
    return parse_instance(data, reference_gaps=reference_gaps)


def parse_instance(data: Any, *, reference_gaps: bool = False) -> Instance:
    if not isinstance(data, dict):
        raise InstanceError("instance must be a JSON object")
    links = data.get("link_seconds")
    if not isinstance(links, list) or not links or len(links) > MAX_PEERS:
        raise InstanceError(f"link_seconds must be a non-empty square matrix of at most {MAX_PEERS} nodes")
    n = len(links)
    try:
        message = np.array(links, dtype=float)
    except (TypeError, ValueError):
        raise InstanceError("link_seconds must contain only numbers") from None
    if message.shape != (n, n):
        raise InstanceError(f"link_seconds must be {n}x{n}, got shape {message.shape}")
    if not np.all(np.isfinite(message)) or np.any(message < 0):
        raise InstanceError("link_seconds must be finite and non-negative")
    off = ~np.eye(n, dtype=bool)
    if np.any(message[off] <= 0):
        i, j = np.argwhere((message <= 0) & off)[0]
        raise InstanceError(f"link_seconds[{i}][{j}] must be positive (a zero-cost link between two nodes)")
    np.fill_diagonal(message, 0.0)
    forward = _per_node(data.get("forward_seconds"), n, "forward_seconds", positive=True)
    memory = _per_node(data.get("memory", 3), n, "memory", positive=True)
    if np.any(memory != np.round(memory)):
        raise InstanceError("memory must be whole numbers of microbatches")
    mb = _int(data.get("microbatches_per_data_node"), "microbatches_per_data_node", 1, 100_000)
    partitions = data.get("partitions")
    if partitions is not None:
        if not isinstance(partitions, list) or not partitions or len(partitions) > MAX_STAGES:
            raise InstanceError("partitions must be a non-empty list of node lists, one per stage")
        parts: list[tuple[int, ...]] = []
        seen: set[int] = set()
        for s, part in enumerate(partitions):
            if not isinstance(part, list) or not part:
                raise InstanceError(f"partitions[{s}] must be a non-empty list of node indices")
            for v in part:
                _int(v, f"partitions[{s}]", 0, n - 1)
                if v in seen:
                    raise InstanceError(f"node {v} appears in two partitions")
                seen.add(v)
            parts.append(tuple(part))
        num_stages = len(parts)
        holders = parts[0]
        partitions_t: tuple[tuple[int, ...], ...] | None = tuple(parts)
    else:
        num_stages = _int(data.get("num_stages"), "num_stages", 1, MAX_STAGES)
        raw_holders = data.get("data_holders")
        if not isinstance(raw_holders, list) or not raw_holders:
            raise InstanceError("without partitions, data_holders (a list of node indices) is required")
        holders = tuple(_int(v, "data_holders", 0, n - 1) for v in raw_holders)
        partitions_t = None
    rpath = _int(data.get("stages_per_path"), "stages_per_path", 1, num_stages)
    tables = CostTables(
        ids=tuple(str(i) for i in range(n)),
        forward=np.repeat(forward[:, None], num_stages, axis=1),
        message=message,
        memory=memory.astype(int),
        backward_factor=_float(data.get("backward_factor", BACKWARD_FACTOR), "backward_factor"),
        loss_factor=_float(data.get("loss_factor", LOSS_FACTOR), "loss_factor"),
        op_gap=REFERENCE_OP_GAP if reference_gaps else 0.0,
        inject_gap=REFERENCE_INJECT_GAP if reference_gaps else 0.0,
    )
    return Instance(tables=tables, microbatches_per_holder=mb, stages_per_path=rpath, num_stages=num_stages,
                    data_holders=tuple(holders), partitions=partitions_t, raw=data)


def reference_routes(instance: Instance, method: str) -> list[SimRoute]:
    """The reference's own routes for `method`, injected as the reference injected them.

    `full_pipeline_dtfm`: the first n data holders (n = nodes per other stage) each inject 9 microbatches
    down their placement column, 3 at each of t = 0, 0.1, 0.2 (27 in all, as the reference did).
    `skippipe`: one path per data holder, 6 microbatches at t = 0, 1, 2, 2.5, 3.5, 4.5.
    `skippipe_without_collision_awareness` and `random_skip`: three paths per data holder (agent
    3*holder + k), each used by 2 microbatches at t = k*w and 2.5 + k*w.
    """
    if instance.partitions is None:
        raise InstanceError("reference routes need the instance's partitions")
    parts = instance.partitions
    stage_of = {v: s for s, part in enumerate(parts) for v in part}
    routes: list[SimRoute] = []
    if method == "full_pipeline_dtfm":
        columns = min(len(p) for p in parts[1:])
        for num in range(columns):
            nodes = tuple(parts[s][num] for s in range(len(parts)))
            for i in range(9):
                routes.append(SimRoute(len(routes), nodes, tuple(range(len(parts))), inject_at=(i % 3) * 0.1))
        return routes
    paths = instance.raw.get("paths", {}).get(method)
    if not isinstance(paths, dict):
        raise InstanceError(f"instance has no reference paths for {method!r}")
    w = float(instance.tables.forward[0, 0])
    for agent in sorted(paths, key=int):
        hops = {int(k): int(v) for k, v in paths[agent].items()}
        origin = next(k for k in hops if k not in hops.values())
        nodes = [origin]
        while nodes[-1] in hops:
            nodes.append(hops[nodes[-1]])
        stages = tuple(stage_of[v] for v in nodes)
        if method == "skippipe":
            times = [d * 2.5 + c for d in range(2) for c in range(3)]
        else:
            k = int(agent) % 3
            times = [d * 2.5 + k * w for d in range(2)]
        for t in times:
            routes.append(SimRoute(len(routes), tuple(nodes), stages, inject_at=t))
    return routes


def _per_node(value: Any, n: int, name: str, positive: bool) -> np.ndarray:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        arr = np.full(n, float(value))
    elif isinstance(value, list) and len(value) == n:
        try:
            arr = np.array(value, dtype=float)
        except (TypeError, ValueError):
            raise InstanceError(f"{name} must contain only numbers") from None
    else:
        raise InstanceError(f"{name} must be a number or a list of {n} numbers")
    if not np.all(np.isfinite(arr)) or (positive and np.any(arr <= 0)):
        raise InstanceError(f"{name} must be finite and positive")
    return arr


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InstanceError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
        raise InstanceError(f"{name} must be a positive number, got {value!r}")
    return float(value)
