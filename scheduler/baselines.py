"""What SkipPipe is compared with: the DT-FM full pipeline and network-oblivious random skip.

Full pipeline: every microbatch visits every stage in order along a fixed column of the placement (one
peer per stage); as in DT-FM and the reference, only the first n data holders inject (n = peers in the
smallest non-zero stage), carrying all the iteration's microbatches so both methods do the same work.
Random skip obeys every rule SkipPipe does (path rules, stage balance) but picks stages and peers without
looking at the network.
"""

from __future__ import annotations

import numpy as np

from scheduler.path_rules import valid_stage_sequences
from scheduler.paths import PathProblem, PlannedRoute, evaluate, stage_budget
from scheduler.simulator import Priority


def full_pipeline(problem: PathProblem, columns: list[list[int]] | None = None) -> list[PlannedRoute]:
    """DT-FM routes: `columns[k]` is the k-th pipeline (its data holder first, then one peer per stage).

    :param columns: default: the k-th peer (by index) of every stage.
    """
    columns = columns or default_columns(problem)
    stages = tuple(served_stages(problem))
    total = sum(problem.microbatches)
    per_column = [total // len(columns) + (1 if k < total % len(columns) else 0) for k in range(len(columns))]
    routes = []
    for j in range(max(per_column, default=0)):
        for col, count in zip(columns, per_column):
            if j < count:
                routes.append(PlannedRoute(col[0], stages, tuple(col[1:])))
    return routes


def served_stages(problem: PathProblem) -> list[int]:
    """The non-zero stages a full pipeline visits: all but those no peer serves."""
    return [s for s in range(1, problem.rules.num_stages) if s not in problem.rules.unserved]


def default_columns(problem: PathProblem) -> list[list[int]]:
    members = problem.stage_members()
    holders = list(problem.holders)
    stages = served_stages(problem)
    n = min([len(members[s]) for s in stages] + [len(holders)])
    return [[holders[k]] + [int(members[s][k]) for s in stages] for k in range(n)]


def tune_columns(problem: PathProblem, *, seed: int = 0, iterations: int = 300,
                 priority: Priority = "backward_first") -> tuple[list[list[int]], float]:
    """Local search over DT-FM column assignments on the simulator: the strongest full-pipeline baseline.

    Moves swap which peer of a stage (or which data holder) serves which column, including peers that the
    default assignment leaves idle. Returns the best columns and their simulated makespan.
    """
    rng = np.random.default_rng(seed)
    all_members = problem.stage_members()
    members = [list(problem.holders)] + [list(map(int, all_members[s])) for s in served_stages(problem)]
    n = min(len(m) for m in members)
    # order[s] lists stage s's peers; the first n form the columns.
    order = [list(m) for m in members]
    cols = lambda: [[order[s][k] for s in range(len(order))] for k in range(n)]  # noqa: E731
    best, _ = evaluate(problem, full_pipeline(problem, cols()), priority)
    for _ in range(iterations):
        s = int(rng.integers(len(order)))
        if len(order[s]) < 2:
            continue
        a, b = rng.choice(len(order[s]), size=2, replace=False)
        if a >= n and b >= n:
            continue
        order[s][a], order[s][b] = order[s][b], order[s][a]
        score, _ = evaluate(problem, full_pipeline(problem, cols()), priority)
        if score < best:
            best = score
        else:
            order[s][a], order[s][b] = order[s][b], order[s][a]
    final = cols()
    return final, evaluate(problem, full_pipeline(problem, final), priority)[1].makespan


def random_skip(problem: PathProblem, *, seed: int = 0, attempts: int = 64) -> list[PlannedRoute]:
    """Balanced random routes: random valid stage sequences within each stage's visit budget, and for each
    hop a random peer among the stage's least-used ones. Blind to links and speeds, as the reference's.

    Drawing sequences one by one can corner itself (no sequence left fits the budgets), so it draws again, up
    to `attempts` times, and keeps the first draw within budget (else the least unbalanced one).
    """
    rng = np.random.default_rng(seed)
    budget = stage_budget(problem)
    best, best_excess = None, None
    for _ in range(attempts):
        routes, counts = _random_routes(problem, rng, budget)
        excess = int(np.maximum(counts - budget, 0).sum())
        if best_excess is None or excess < best_excess:
            best, best_excess = routes, excess
        if excess == 0:
            break
    return best


def _random_routes(problem: PathProblem, rng: np.random.Generator, budget: np.ndarray
                   ) -> tuple[list[PlannedRoute], np.ndarray]:
    counts = np.zeros_like(budget)
    members = problem.stage_members()
    used = np.zeros(problem.tables.num_peers, dtype=int)
    sequences = valid_stage_sequences(problem.rules)
    routes = []
    for j in range(max(problem.microbatches, default=0)):
        for h, m in zip(problem.holders, problem.microbatches):
            if j >= m:
                continue
            fits = [seq for seq in sequences if all(counts[s] < budget[s] for s in seq)] or list(sequences)
            seq = fits[int(rng.integers(len(fits)))]
            nodes = []
            for s in seq:
                pool = members[s]
                least = pool[used[pool] == used[pool].min()]
                v = int(rng.choice(least))
                used[v] += 1
                nodes.append(v)
                counts[s] += 1
            routes.append(PlannedRoute(h, tuple(seq), tuple(nodes)))
    return routes, counts
