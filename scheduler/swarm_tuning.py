"""The SWARM-style baseline's own best placement: SWARM's throughput balance, then tuned on the simulator.

Balancing throughput (`swarm_balance.swarm_placement`) is blind to which peers sit close to which: on a
geo-distributed swarm it can leave adjacent stages an ocean apart. SkipPipe's placement is searched on its simulated
iteration; for a fair comparison the SWARM baseline's is too: a seeded local search moves or swaps peers off stage 0
and keeps a change when the mean simulated iteration over a fixed set of wiring draws (the same draws for every
candidate, so that they compare on equal terms) gets shorter. Data holders stay where they are.
"""

from __future__ import annotations

import numpy as np

from scheduler.costs import CostTables
from scheduler.path_rules import PathRules, rules_around
from scheduler.paths import PathProblem, evaluate
from scheduler.simulator import Priority
from scheduler.swarm_wiring import redraw

TUNING_DRAWS = 8
"""Wiring draws each candidate placement is scored on."""


def score_over_draws(problem: PathProblem, *, seed: int, draws: int = TUNING_DRAWS,
                     priority: Priority = "backward_first") -> float:
    """Mean simulated iteration of `draws` wirings (iterations 0..draws-1 of epoch 0 of `seed`) on `problem`."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    return float(np.mean([evaluate(problem, redraw(problem, seed, 0, i), priority)[0] for i in range(draws)]))


def tune_swarm_placement(problem: PathProblem, *, seed: int = 0, iterations: int = 100, draws: int = TUNING_DRAWS,
                         priority: Priority = "backward_first") -> tuple[np.ndarray, float]:
    """Local search from `problem.stage_of` (every non-zero stage served, paths visiting all of them): each step
    moves a peer off stage 0 to another non-zero stage (its own keeps a peer) or swaps two such peers of different
    stages, and is kept when `score_over_draws` improves.

    :returns: the best placement found and its score
    :raises ValueError: `iterations` < 0, or a non-zero stage without peers
    """
    if iterations < 0:
        raise ValueError(f"iterations must be >= 0, got {iterations}")
    s = problem.rules.num_stages
    stage_of = np.array(problem.stage_of, copy=True)
    if any(not np.any(stage_of == st) for st in range(1, s)):
        raise ValueError("every non-zero stage needs a peer to tune a SWARM placement")
    rules = PathRules(s, s, max_swaps=0)
    rng = np.random.default_rng(seed)

    def score(placement: np.ndarray) -> float:
        return score_over_draws(PathProblem(problem.tables, placement, problem.holders, problem.microbatches, rules),
                                seed=seed, draws=draws, priority=priority)

    best = score(stage_of)
    movable = np.flatnonzero(stage_of > 0)
    if s < 3:  # one non-zero stage: nothing to move
        return stage_of, best
    for _ in range(iterations):
        a = int(rng.choice(movable))
        trial = stage_of.copy()
        if rng.random() < 0.5:
            others = [st for st in range(1, s) if st != stage_of[a]]
            if not others or np.sum(stage_of == stage_of[a]) < 2:
                continue
            trial[a] = int(rng.choice(others))
        else:
            b = int(rng.choice(movable))
            if stage_of[a] == stage_of[b]:
                continue
            trial[a], trial[b] = stage_of[b], stage_of[a]
        value = score(trial)
        if value < best:
            stage_of, best = trial, value
    return stage_of, best


def move_pays(tables: CostTables, before: np.ndarray, after: np.ndarray, counts: dict[int, int], *, seed: int = 0,
              draws: int = TUNING_DRAWS, priority: Priority = "backward_first") -> bool:
    """Whether the SWARM wiring simulates no slower on placement `after` than on `before` (the mean over the same
    `draws` wirings): a rebalancing move the throughput estimate calls for, checked against what it is for.

    :param counts: data holder index -> microbatches it injects (the holders of both placements)
    :raises ValueError: a holder of `counts` off stage 0 in either placement
    """
    holders = tuple(sorted(counts))
    per = tuple(counts[h] for h in holders)
    s = tables.num_stages

    def score(stage_of: np.ndarray) -> float:
        unserved = {st for st in range(1, s) if not np.any(stage_of == st)}
        rules = PathRules(s, s, max_swaps=0)
        if unserved:
            rules = rules_around(rules, unserved)[0]
        return score_over_draws(PathProblem(tables, stage_of, holders, per, rules), seed=seed, draws=draws,
                                priority=priority)

    return score(after) <= score(before)
