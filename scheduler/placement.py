"""Peer -> stage placement on heterogeneous peers, from scratch and incrementally.

The reference places with a genetic algorithm on a proxy (a travelling-salesman tour over stages plus the
worst intra-stage link), 28 s for 20 nodes. Skip paths do not follow a fixed stage order, so a tour is
the wrong proxy. Here a placement is scored by what it is for: the simulated iteration of quickly planned
routes (most-constrained-first, capacity-aware), plus the slowest stage's averaging round. A seeded local
search swaps peers between stages. Joins and departures are incremental: a joining peer goes to the
stage where it helps most, and survivors move only with cause: a stage left empty that paths cannot skip, or a
stage group a departure shrank into the swarm's bottleneck (`rebalance`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from scheduler.baselines import full_pipeline
from scheduler.constants import REBALANCE_CANDIDATES, REBALANCE_HORIZON, REBALANCE_MIN_GAIN, STATE_BYTES_PER_PARAM_BYTE
from scheduler.costs import CostTables
from scheduler.path_rules import PathRules
from scheduler.paths import PathProblem, RouteFinder, construct_by_capacity, evaluate


@dataclass(frozen=True)
class PlacementGoal:
    """What a placement is scored on."""

    rules: PathRules
    microbatches_per_holder: int
    stage_param_bytes: tuple[int, ...] = ()
    """Bytes each stage averages per iteration (0 = ignore the data-parallel cost)."""
    latency: np.ndarray | None = None
    bandwidth: np.ndarray | None = None
    """Links for the averaging cost (seconds, bytes/s); needed only with `stage_param_bytes`."""
    columns: bool = False
    """Score for a full pipeline (DT-FM columns, every microbatch through every stage) instead of SkipPipe's
    paths: the baseline's runtime then places joiners and movers where its columns need them."""


def stage_sizes(num_peers: int, rules: PathRules, data_holders: int | None = None) -> list[int]:
    """Peers per stage from the sizing rule D*(R-1) = n*(S-1): every peer then handles about M microbatches.

    :param data_holders: fix D (e.g. the peers that have data); default: as the rule suggests.
    """
    s = rules.num_stages
    if num_peers < s:
        raise ValueError(f"{num_peers} peers cannot serve {s} stages (need at least one peer per stage)")
    if s == 1:
        return [num_peers]
    if data_holders is None:
        data_holders = round(num_peers / rules.stages_per_path)  # N = D + n(S-1) and n(S-1) = D(R-1)
    d = int(min(max(1, data_holders), num_peers - (s - 1)))
    base, extra = divmod(num_peers - d, s - 1)
    return [d] + [base + (1 if k < extra else 0) for k in range(s - 1)]


def averaging_seconds(stage_of: np.ndarray, goal: PlacementGoal) -> float:
    """Slowest stage's ring all-reduce: 2 (k-1)/k of its bytes over its slowest member link, plus latency."""
    if not goal.stage_param_bytes or goal.bandwidth is None or goal.latency is None:
        return 0.0
    worst = 0.0
    for s, nbytes in enumerate(goal.stage_param_bytes):
        members = np.flatnonzero(stage_of == s)
        k = len(members)
        if k < 2 or nbytes <= 0:
            continue
        sub_bw = goal.bandwidth[np.ix_(members, members)][~np.eye(k, dtype=bool)]
        sub_lat = goal.latency[np.ix_(members, members)][~np.eye(k, dtype=bool)]
        worst = max(worst, 2 * (k - 1) / k * nbytes / sub_bw.min() + 2 * (k - 1) * sub_lat.max())
    return worst


def score_placement(tables: CostTables, stage_of: np.ndarray, goal: PlacementGoal,
                    counts: dict[int, int] | None = None) -> float:
    """Simulated iteration of quickly planned routes on this placement, plus its averaging round.

    :param counts: data holder -> microbatches it injects (default: `goal.microbatches_per_holder` each)
    """
    holders = tuple(int(h) for h in np.flatnonzero(stage_of == 0))
    per = goal.microbatches_per_holder
    s = goal.rules.num_stages
    if goal.columns and not all(np.any(stage_of == st) for st in range(s)):
        return float("inf")  # a full pipeline cannot run without a stage
    rules = PathRules(s, s, max_swaps=0) if goal.columns else goal.rules
    try:
        problem = PathProblem(tables, stage_of, holders, tuple((counts or {}).get(h, per) for h in holders), rules)
    except ValueError:
        return float("inf")
    if goal.columns:
        routes = full_pipeline(problem)  # the k-th peer of every stage: as many columns as the smallest group
    else:
        routes = construct_by_capacity(problem, finder=RouteFinder(problem), group_size=int(tables.memory.min()))
    score, _ = evaluate(problem, routes, "backward_first")
    return score + averaging_seconds(stage_of, goal)


def place(tables: CostTables, goal: PlacementGoal, *, pinned: dict[int, int] | None = None,
          sizes: list[int] | None = None, seed: int = 0, iterations: int = 150) -> np.ndarray:
    """A placement for every peer of `tables`.

    :param pinned: peer index -> stage it must keep (data holders with a shard are pinned to stage 0).
    :param sizes: peers per stage; default: the sizing rule, with D = number of pinned data holders if any.
    :returns: [peer] stage.
    """
    rng = np.random.default_rng(seed)
    n, s = tables.num_peers, goal.rules.num_stages
    pinned = dict(pinned or {})
    pinned_holders = [v for v, st in pinned.items() if st == 0]
    sizes = sizes or stage_sizes(n, goal.rules, len(pinned_holders) or None)
    if sum(sizes) != n or len(sizes) != s:
        raise ValueError(f"stage sizes {sizes} do not cover {n} peers in {s} stages")
    stage_of = np.full(n, -1)
    for v, st in pinned.items():
        stage_of[v] = st
    # Greedy start: the fastest, best-connected free peers become data holders (they do the most work:
    # forward, loss and backward of every microbatch they inject); the rest fill stages round-robin by speed.
    connect = tables.message.sum(axis=1)
    speed = tables.forward[:, 0]
    free = [v for v in np.argsort(speed + connect / max(1, n)) if stage_of[v] < 0]
    need = [sizes[st] - int(np.sum(stage_of == st)) for st in range(s)]
    if any(x < 0 for x in need):
        raise ValueError("more peers pinned to a stage than the stage sizes allow")
    for v in free[: need[0]]:
        stage_of[v] = 0
    slots = [st for k in range(max(need[1:], default=0)) for st in range(1, s) if k < need[st]]
    for v, st in zip(free[need[0]:], slots):
        stage_of[v] = st
    best = score_placement(tables, stage_of, goal)
    movable = [v for v in range(n) if v not in pinned]
    if len(movable) < 2:
        return stage_of
    for _ in range(iterations):
        a, b = rng.choice(movable, size=2, replace=False)
        if stage_of[a] == stage_of[b]:
            continue
        stage_of[a], stage_of[b] = stage_of[b], stage_of[a]
        score = score_placement(tables, stage_of, goal)
        if score < best:
            best = score
        else:
            stage_of[a], stage_of[b] = stage_of[b], stage_of[a]
    return stage_of


def place_joining(tables: CostTables, stage_of: np.ndarray, peer: int, goal: PlacementGoal, *,
                  data_holder: bool = False, holder_wanted: bool = False, avoid: Collection[int] = ()) -> np.ndarray:
    """Place one new peer (index `peer`, currently -1) where the swarm's score improves most; nobody else moves.

    A stage that lost all its peers comes first: until someone serves it, paths have to skip it. Then, with
    `holder_wanted`, stage 0: a data shard whose holder left is carried by another holder, which then injects
    twice the microbatches and runs twice the loss steps, the whole iteration waiting on it. Stages in `avoid`
    (one the peer could not take up) are passed over while another non-zero stage remains.
    """
    out = stage_of.copy()
    if data_holder:
        out[peer] = 0
        return out
    stages = [st for st in range(1, goal.rules.num_stages) if st not in avoid] or \
        list(range(1, goal.rules.num_stages))
    empty = [st for st in stages if not np.any(stage_of == st)]
    if empty or (holder_wanted and 0 not in avoid):
        out[peer] = empty[0] if empty else 0
        return out
    options = []
    for st in stages:
        out[peer] = st
        options.append((score_placement(tables, out, goal), int(np.sum(stage_of == st)), st))
    out[peer] = min(options)[2]
    return out


def place_after_departure(tables: CostTables, stage_of: np.ndarray, departed: list[int], goal: PlacementGoal, *,
                          fixed: set[int] = frozenset()) -> tuple[np.ndarray, list[int]]:
    """Survivors keep their stages unless a stage is left without peers; then the one move that scores best
    (a peer not `fixed`, from a stage that can spare one) refills it. Returns the new placement and the peers
    moved."""
    out = stage_of.copy()
    out[list(departed)] = -1
    moved: list[int] = []
    for st in range(goal.rules.num_stages):
        if np.any(out == st):
            continue
        counts = np.bincount(out[out >= 0], minlength=goal.rules.num_stages)
        donors = [v for v in np.flatnonzero(out >= 0) if counts[out[v]] > 1 and out[v] != 0 and int(v) not in fixed]
        if not donors:
            continue  # nobody can move: the path planner skips the empty stage
        options = []
        for v in donors:
            trial = out.copy()
            trial[v] = st
            options.append((score_placement(tables, trial, goal), int(v)))
        v = min(options)[1]
        out[v] = st
        moved.append(v)
    return out, moved



def rebalance(tables: CostTables, stage_of: np.ndarray, shrunk: set[int], goal: PlacementGoal, *,
              counts: dict[int, int] | None = None, fixed: set[int] = frozenset(),
              unsettled: set[int] = frozenset(), min_gain: float = REBALANCE_MIN_GAIN
              ) -> tuple[np.ndarray, dict[int, int], dict[int, int]]:
    """After departures: for each stage group they `shrunk`, the one move of a survivor into it that shortens the
    quickly planned iteration most, if by at least `min_gain` and by more than the state transfer costs over
    `REBALANCE_HORIZON` iterations. A lost peer can leave its stage the swarm's bottleneck (a lone peer serving
    a whole group's microbatches; a data holder carrying a departed holder's shard, injecting and running the
    loss of twice the microbatches) until a volunteer joins: one move often buys back most of the iteration.

    Movers come from non-zero stages that keep a peer, and are neither `fixed` (e.g. peers with their own data)
    nor `unsettled` (joiners and movers whose stage is not yet in force: they do not hold it yet, so they can
    neither move nor hand a stage's state to a mover). A
    mover to stage 0 takes a carried shard over: it injects a holder's share of the holder carrying the most,
    so stage 0 is a target only while some holder carries more than its share. Empty stages are not targets
    (paths skip them; `place_after_departure` refills them where paths cannot).

    :param counts: data holder -> microbatches it injects (default: `goal.microbatches_per_holder` each)
    :returns: the new placement, the new counts, and mover -> the peer of its new stage it takes the state from
        (the one with the fastest link to it)
    """
    out = stage_of.copy()
    per = goal.microbatches_per_holder
    counts = dict(counts or {int(h): per for h in np.flatnonzero(out == 0)})
    moves: dict[int, int] = {}
    for st in sorted(shrunk):
        members = [int(v) for v in np.flatnonzero(out == st) if int(v) not in moves and int(v) not in unsettled]
        carrier = max(counts, key=lambda h: (counts[h], -h), default=None)
        if not members or (st == 0 and (carrier is None or counts[carrier] <= per)):
            continue
        base = score_placement(tables, out, goal, counts)
        best: tuple[float, int, np.ndarray, dict[int, int]] | None = None
        for v in movers_to(tables, out, st, goal.rules.num_stages, set(moves) | set(fixed) | set(unsettled)):
            trial, trial_counts = out.copy(), dict(counts)
            trial[v] = st
            if st == 0:
                trial_counts[carrier] -= per
                trial_counts[v] = per
            score = score_placement(tables, trial, goal, trial_counts)
            if best is None or score < best[0]:
                best = (score, v, trial, trial_counts)
        if best is None:
            continue
        score, v, trial, trial_counts = best
        source = max(members, key=lambda m: (_state_bandwidth(tables, goal, m, v), -m))
        transfer = _transfer_seconds(goal, st, source, v)
        if score <= base * (1 - min_gain) and (base - score) * REBALANCE_HORIZON > transfer:
            out, counts = trial, trial_counts
            moves[v] = source
    return out, counts, moves


def movers_to(tables: CostTables, stage_of: np.ndarray, stage: int, num_stages: int, fixed: set[int],
              limit: int = REBALANCE_CANDIDATES) -> list[int]:
    """Up to `limit` peers that may move to `stage`, best first: from the largest other non-zero groups (each
    keeps a peer), then the best connected to the peers of the stages next to it (those it will exchange with)."""
    sizes = np.bincount(stage_of[stage_of >= 0], minlength=num_stages)
    spare = [int(v) for v in np.flatnonzero(stage_of > 0)
             if stage_of[v] != stage and sizes[stage_of[v]] >= 2 and int(v) not in fixed]
    near = np.flatnonzero(np.isin(stage_of, [stage - 1, (stage + 1) % num_stages]))
    spare.sort(key=lambda v: (-sizes[stage_of[v]],
                              float(tables.message[v, near].sum() + tables.message[near, v].sum()), v))
    return spare[:limit]


def _state_bandwidth(tables: CostTables, goal: PlacementGoal, source: int, to: int) -> float:
    if goal.bandwidth is not None:
        return float(goal.bandwidth[source, to])
    return 1.0 / max(float(tables.message[source, to]), 1e-9)


def _transfer_seconds(goal: PlacementGoal, stage: int, source: int, to: int) -> float:
    """Seconds to send a stage's weights and optimizer state over one link (0 when the goal has no link data)."""
    if not goal.stage_param_bytes or goal.bandwidth is None or goal.latency is None:
        return 0.0
    nbytes = STATE_BYTES_PER_PARAM_BYTE * goal.stage_param_bytes[stage]
    return float(nbytes / goal.bandwidth[source, to] + goal.latency[source, to])
