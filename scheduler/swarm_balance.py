"""SWARM-style placement: peers spread over stages by measured throughput, and rebalanced toward the bottleneck.

The baseline of SWARM parallelism (Ryabinin et al. 2023) as this project's planner sees it. A peer's throughput at
its stage is the rate at which a peer of the previous stage sees it process microbatches one after another: one
over its compute (forward, backward, and the loss at stage 0) plus the round trip of one activation and one
gradient on the link between them (`hop_rate`). A stage's throughput is the sum over its peers of their rate, as
seen from the previous stage's peers on average. Every microbatch visits every stage, so the stage with the lowest
throughput is the bottleneck. As in SWARM, a joining peer goes to the bottleneck stage, and a rebalancing step
moves one peer from the stage with the highest throughput (the least loaded) to the bottleneck, when that raises
the slowest stage's throughput (`rebalance_once`). `swarm_placement` is SWARM's own best placement: greedy by
speed into the bottleneck, then rebalancing steps until none helps.

Stage 0 is this project's data holders (they own the data shards and inject and finish every microbatch): they
are pinned, never moved by rebalancing; the data holders' count is the caller's (the same as SkipPipe's, so both
carry the same samples per iteration).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from scheduler.costs import CostTables

MIN_RELATIVE_GAIN = 1e-6
"""A rebalancing move must raise the slowest stage's throughput by at least this fraction (no churn on ties)."""


def service_seconds(tables: CostTables, stage_of: np.ndarray) -> np.ndarray:
    """[peer] compute seconds of one microbatch at its stage: forward and backward (and the loss at stage 0);
    inf for a peer without a stage."""
    out = np.full(tables.num_peers, np.inf)
    placed = np.flatnonzero(stage_of >= 0)
    st = stage_of[placed]
    out[placed] = (1 + tables.backward_factor) * tables.forward[placed, st]
    holders = placed[st == 0]
    out[holders] += tables.loss_times()[holders]
    return out


def hop_rate(tables: CostTables, stage_of: np.ndarray, sender: int, receivers: np.ndarray) -> np.ndarray:
    """Microbatches per second each of `receivers` processes as `sender` observes it: one over its compute plus
    the activation's and the gradient's time on the link between them."""
    receivers = np.asarray(receivers, dtype=int)
    svc = service_seconds(tables, stage_of)[receivers]
    link = tables.message[sender, receivers] + tables.message[receivers, sender]
    return 1.0 / (svc + link)


def stage_throughput(tables: CostTables, stage_of: np.ndarray, num_stages: int) -> np.ndarray:
    """[stage] microbatches per second each stage can process: the sum of its peers' rates, each averaged over
    the peers of the stage before it (stage 0's data holders before stage 1; the last stage's peers before
    stage 0). 0 for a stage without peers."""
    _check_placement(tables, stage_of, num_stages)
    out = np.zeros(num_stages)
    for s in range(num_stages):
        members = np.flatnonzero(stage_of == s)
        if len(members) == 0:
            continue
        senders = _previous_members(stage_of, s, num_stages)
        if len(senders) == 0:
            svc = service_seconds(tables, stage_of)[members]
            out[s] = float(np.sum(1.0 / svc))
            continue
        rates = np.mean([hop_rate(tables, stage_of, int(u), members) for u in senders], axis=0)
        out[s] = float(np.sum(rates))
    return out


def bottleneck(tables: CostTables, stage_of: np.ndarray, num_stages: int) -> int:
    """The non-zero stage with the lowest throughput (the lowest index on ties)."""
    if num_stages < 2:
        raise ValueError("a swarm of one stage has no stage to balance")
    thr = stage_throughput(tables, stage_of, num_stages)
    return 1 + int(np.argmin(thr[1:]))


def join_stage(tables: CostTables, stage_of: np.ndarray, num_stages: int, *, avoid: Collection[int] = ()) -> int:
    """Where SWARM sends a joining peer: the bottleneck stage (an empty stage first: its throughput is 0), of the
    non-zero stages not in `avoid` (one the peer could not take up) while any is left."""
    if num_stages < 2:
        raise ValueError("a swarm of one stage has no stage to balance")
    thr = stage_throughput(tables, stage_of, num_stages)
    stages = [s for s in range(1, num_stages) if s not in avoid] or list(range(1, num_stages))
    return min(stages, key=lambda s: (thr[s], s))


def rebalance_once(tables: CostTables, stage_of: np.ndarray, num_stages: int, *, fixed: set[int] = frozenset()
                   ) -> tuple[np.ndarray, tuple[int, int, int] | None]:
    """One SWARM rebalancing step: of the peers of the non-zero stage with the highest throughput (that can spare
    one: two peers or more, the mover not `fixed`), the one whose move to the bottleneck stage raises the slowest
    non-zero stage's throughput most, if it raises it at all.

    :returns: the new placement (a copy) and the move (peer, from stage, to stage), or the same placement and
        None when no move helps
    """
    out = np.array(stage_of, copy=True)
    if num_stages < 2:
        return out, None
    thr = stage_throughput(tables, out, num_stages)
    target = 1 + int(np.argmin(thr[1:]))
    sizes = np.bincount(out[out >= 0], minlength=num_stages)
    donors = [s for s in range(1, num_stages) if s != target and sizes[s] >= 2 and
              any(int(v) not in fixed for v in np.flatnonzero(out == s))]
    if not donors:
        return out, None
    donor = max(donors, key=lambda s: (thr[s], -s))
    floor = float(thr[1:].min())
    best: tuple[float, int] | None = None
    for v in np.flatnonzero(out == donor):
        if int(v) in fixed:
            continue
        trial = out.copy()
        trial[v] = target
        low = float(stage_throughput(tables, trial, num_stages)[1:].min())
        if best is None or low > best[0]:
            best = (low, int(v))
    if best is None or best[0] <= floor * (1 + MIN_RELATIVE_GAIN):
        return out, None
    out[best[1]] = target
    return out, (best[1], donor, target)


def swarm_placement(tables: CostTables, num_stages: int, num_holders: int, *,
                    pinned: dict[int, int] | None = None, max_moves: int | None = None) -> np.ndarray:
    """SWARM's own placement of every peer of `tables`: pinned peers keep their stage; stage 0 is topped up to
    `num_holders` data holders with the fastest, best-connected free peers; the other free peers, fastest first,
    each join the bottleneck stage; then rebalancing steps (pinned peers stay) until none helps.

    :param pinned: peer index -> stage it must keep (data holders with a shard on stage 0)
    :param max_moves: rebalancing steps at most (default: peers x stages)
    :returns: [peer] stage
    :raises ValueError: too few peers for the stages, a pinned stage out of range, or more pinned data holders
        than `num_holders`
    """
    n = tables.num_peers
    if num_stages < 1 or num_stages != tables.num_stages:
        raise ValueError(f"{num_stages} stages asked, the cost tables have {tables.num_stages}")
    if n < num_stages:
        raise ValueError(f"{n} peers cannot serve {num_stages} stages (need at least one peer per stage)")
    pinned = dict(pinned or {})
    if any(not 0 <= int(v) < n for v in pinned) or any(not 0 <= int(s) < num_stages for s in pinned.values()):
        raise ValueError("pinned peers and stages must be in range")
    stage_of = np.full(n, -1)
    for v, s in pinned.items():
        stage_of[int(v)] = int(s)
    have = int(np.sum(stage_of == 0))
    if not 1 <= num_holders <= n - (num_stages - 1) or have > num_holders:
        raise ValueError(f"{num_holders} data holders cannot be placed ({have} pinned to stage 0, {n} peers, "
                         f"{num_stages} stages)")
    free = [int(v) for v in np.argsort(tables.forward[:, 0] + tables.message.sum(axis=1) / max(1, n), kind="stable")
            if stage_of[v] < 0]
    for v in free[:num_holders - have]:
        stage_of[v] = 0
    rest = [v for v in free[num_holders - have:]]
    rest.sort(key=lambda v: (float(tables.forward[v].sum()), v))  # fastest first: big pieces first balance best
    for v in rest:
        if num_stages < 2:
            stage_of[v] = 0
            continue
        stage_of[v] = join_stage(tables, stage_of, num_stages)
    fixed = {int(v) for v in pinned} | {int(v) for v in np.flatnonzero(stage_of == 0)}
    for _ in range(max_moves if max_moves is not None else n * num_stages):
        stage_of, move = rebalance_once(tables, stage_of, num_stages, fixed=fixed)
        if move is None:
            break
    return stage_of


def _previous_members(stage_of: np.ndarray, stage: int, num_stages: int) -> np.ndarray:
    """The peers that send a stage its activations: the stage before it (before stage 0: the last stage)."""
    for k in range(1, num_stages + 1):
        prev = (stage - k) % num_stages
        members = np.flatnonzero(stage_of == prev)
        if len(members) or prev == stage:
            return members if prev != stage else np.array([], dtype=int)
    return np.array([], dtype=int)


def _check_placement(tables: CostTables, stage_of: np.ndarray, num_stages: int) -> None:
    if num_stages != tables.num_stages:
        raise ValueError(f"{num_stages} stages asked, the cost tables have {tables.num_stages}")
    if np.shape(stage_of) != (tables.num_peers,):
        raise ValueError(f"placement must give one stage per peer ({tables.num_peers}), got shape "
                         f"{np.shape(stage_of)}")
    if np.any(stage_of >= num_stages) or np.any(stage_of < -1):
        raise ValueError(f"placement stages must be -1 (unplaced) or 0..{num_stages - 1}")
