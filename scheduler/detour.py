"""Detours: how a microbatch in flight goes around a peer that is gone, and which detours a receiver accepts.

A forward that cannot reach its next peer goes to another peer of the same stage: same-stage peers hold the same
weights, so the microbatch computes exactly what it would have. When no live peer serves that stage, the forward
takes another stage at that hop instead, one the path does not visit yet and for which the path still obeys every
rule (R stages, each once, swap and jump limits): a different sub-network, as skipping always trains, never a
shorter path. Only forwards are detoured: once a peer holds a microbatch's activations its backward pass can go
through nobody else, and its data holder runs it again from the start on a detour of its route.

Pure functions of the schedule, so that every peer on a path reaches the same verdict on a detoured route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from scheduler.path_rules import path_violation
from scheduler.schedule import Route, Schedule


def detour(schedule: Schedule, route: Route, hop: int, gone: Collection[str]) -> Route | None:
    """`route` around its peer at `hop` (`route.nodes[hop]`; hop 1 is the first peer after the origin).

    A live peer of the same stage if there is one, else of the nearest stage (lower first) that keeps the path
    valid; among a stage's candidates the microbatch's number picks one, so that a dead peer's microbatches
    spread over the survivors. None when no stage can take the hop.
    """
    if not 1 <= hop < len(route.nodes):
        raise ValueError(f"hop {hop} is not a peer of the route (1..{len(route.nodes) - 1})")
    stage = route.stages[hop - 1]
    on_route = set(route.nodes)
    others = sorted((s for s in range(1, schedule.num_stages) if s not in route.stages),
                    key=lambda s: (abs(s - stage), s))
    for candidate in (stage, *others):
        stages = (*route.stages[:hop - 1], candidate, *route.stages[hop:])
        if candidate != stage and path_violation(stages, schedule.rules) is not None:
            continue
        peers = [p for p in schedule.stage_peers(candidate) if p not in gone and p not in on_route]
        if peers:
            substitute = peers[route.microbatch % len(peers)]
            return dataclasses.replace(route, stages=stages,
                                       peers=(*route.peers[:hop - 1], substitute, *route.peers[hop:]))
    return None


def detour_violation(schedule: Schedule, scheduled: Route, nodes: Sequence[str], stages: Sequence[int]) -> str | None:
    """Why `nodes` (origin first) over the non-zero `stages` is not a detour of `scheduled`, or None when it is.

    A detour keeps the origin and the number of stages, obeys the path rules, and has each stage served by a
    peer the schedule places there, each peer once.
    """
    if len(nodes) != len(stages) + 1:
        return f"{len(nodes)} peers for {len(stages)} stages"
    if nodes[0] != scheduled.origin:
        return f"origin {nodes[0]} is not the scheduled {scheduled.origin}"
    if len(stages) != len(scheduled.stages):
        return f"{len(stages)} stages, the schedule has {len(scheduled.stages)}"
    if len(set(nodes)) != len(nodes):
        return "a peer appears twice"
    why = path_violation(tuple(stages), schedule.rules)
    if why is not None:
        return why
    for peer, stage in zip(nodes[1:], stages):
        if schedule.placement.get(peer) != stage:
            return f"{peer} does not serve stage {stage}"
    return None
