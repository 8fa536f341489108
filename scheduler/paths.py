"""The SkipPipe path planner: a route for every microbatch of every data holder.

The reference plans with conflict-based search over a time-aware A*, exponential in the number of
conflicts. This planner is polynomial and anytime:

1. Priority planning. Microbatches are taken round-robin over data holders; each gets the route that
   minimises its isolated round-trip time plus a congestion penalty on peers already loaded, among the
   stage sequences that the reorder rules allow and whose stages still have visit budget (stage balance).
   For one stage sequence the best peers come from a layered shortest path (exact, vectorised).
2. Repair. If the budget could not be met exactly, stage exchanges between microbatches restore balance.
3. Local search on the simulated makespan (collision awareness, TC2): re-route one microbatch, exchange
   a stage between two microbatches, or swap two microbatches' injection order; a move is kept when the
   simulated iteration (with memory admission, TC1) gets shorter. Deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scheduler.costs import CostTables
from scheduler.path_rules import PathRules, path_violation, valid_stage_sequences
from scheduler.simulator import Priority, SimResult, SimRoute, simulate

JITTER_SEED = 0
"""Seed of the jittered draws `evaluate` scores on: the same for every candidate, so their scores compare."""


@dataclass(frozen=True)
class PathProblem:
    """What the path planner needs: costs, who serves which stage, who injects how much, the rules."""

    tables: CostTables
    stage_of: np.ndarray
    """[peer] stage it serves (-1: not placed)."""
    holders: tuple[int, ...]
    """Data holders that inject, in injection priority order."""
    microbatches: tuple[int, ...]
    """Microbatches each of `holders` injects this iteration."""
    rules: PathRules

    def __post_init__(self) -> None:
        if len(self.holders) != len(self.microbatches):
            raise ValueError("one microbatch count per data holder")
        for h in self.holders:
            if self.stage_of[h] != 0:
                raise ValueError(f"data holder {self.tables.ids[h]} is not placed on stage 0")
        if self.rules.num_stages != self.tables.num_stages:
            raise ValueError(f"rules are for {self.rules.num_stages} stages, costs for {self.tables.num_stages}")
        for s in range(1, self.rules.num_stages):
            if not np.any(self.stage_of == s) and self.rules.hops > 0 and s not in self.rules.unserved:
                raise ValueError(f"stage {s} has no peer (paths can skip it only if the rules list it as unserved)")

    def stage_members(self) -> list[np.ndarray]:
        return [np.flatnonzero(self.stage_of == s) for s in range(self.rules.num_stages)]


@dataclass
class PlannedRoute:
    """A route under construction (mutable inside the planner)."""

    origin: int
    stages: tuple[int, ...]
    nodes: tuple[int, ...]
    """Peers for `stages` (the origin excluded)."""
    inject_at: float = 0.0
    """Earliest injection time: staggering a holder's microbatches can avoid collisions downstream."""

    def sim(self, microbatch: int) -> SimRoute:
        return SimRoute(microbatch, (self.origin, *self.nodes), (0, *self.stages), self.inject_at)


@dataclass
class PathPlan:
    """The planner's answer: routes in injection order plus their simulated iteration."""

    routes: list[PlannedRoute]
    result: SimResult
    iterations: int = 0
    improvements: int = 0
    history: list[float] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return self.result.makespan


def to_sim_routes(routes: list[PlannedRoute]) -> list[SimRoute]:
    return [r.sim(i) for i, r in enumerate(routes)]


class RouteFinder:
    """Best peers for a stage sequence (layered shortest path) and best sequences for a data holder."""

    def __init__(self, problem: PathProblem, *, in_order_only: bool = False) -> None:
        self.p = problem
        t = problem.tables
        self.members = problem.stage_members()
        self.work = (1 + t.backward_factor) * t.forward  # [peer, stage] compute per visit
        self.hop = t.message + t.message.T  # activation one way, gradient the other
        seqs = valid_stage_sequences(problem.rules)
        if in_order_only:
            seqs = tuple(s for s in seqs if list(s) == sorted(s)) or seqs
        self.sequences = seqs

    def best_nodes(self, origin: int, stages: tuple[int, ...], penalty: np.ndarray) -> tuple[float, tuple[int, ...]]:
        """Cheapest peers for `stages` from `origin` and back: isolated time plus `penalty` per peer."""
        if not stages:
            return 0.0, ()
        back: list[np.ndarray] = []
        prev = np.array([origin])
        cost = np.zeros(1)
        for s in stages:
            cand = self.members[s]
            total = cost[:, None] + self.hop[np.ix_(prev, cand)]
            arg = np.argmin(total, axis=0)
            cost = total[arg, np.arange(len(cand))] + self.work[cand, s] + penalty[cand]
            back.append(arg)
            prev = cand
        cost = cost + self.hop[prev, origin]
        k = int(np.argmin(cost))
        best = float(cost[k])
        nodes = []
        for s, arg in zip(reversed(stages), reversed(back)):
            nodes.append(int(self.members[s][k]))
            k = int(arg[k])
        return best, tuple(reversed(nodes))

    def ranked(self, origin: int, penalty: np.ndarray, allowed=None
               ) -> list[tuple[float, tuple[int, ...], tuple[int, ...]]]:
        """(score, stages, nodes) for every allowed sequence, best first."""
        out = []
        for seq in self.sequences:
            if allowed is not None and not allowed(seq):
                continue
            score, nodes = self.best_nodes(origin, seq, penalty)
            out.append((score, seq, nodes))
        out.sort(key=lambda x: (x[0], x[1]))
        return out


def stage_budget(problem: PathProblem) -> np.ndarray:
    """Visits each served non-zero stage may take so that all of them are within one of each other."""
    s = problem.rules.num_stages
    hops = sum(problem.microbatches) * problem.rules.hops
    budget = np.zeros(s, dtype=int)
    served = [st for st in range(1, s) if st not in problem.rules.unserved]
    if served:
        base, extra = divmod(hops, len(served))
        budget[served] = base
        budget[served[:extra]] += 1
    return budget


def construct(problem: PathProblem, *, congestion: float = 1.0, rounds: int = 12,
              finder: RouteFinder | None = None, priority: Priority = "backward_first") -> list[PlannedRoute]:
    """Negotiated-congestion routing (PathFinder, from FPGA routing) of microbatch groups.

    Each data holder's microbatches form groups of at most its memory slots that share a route. Round
    after round every group is ripped up and re-routed on its isolated time plus a price on peers whose
    assigned work exceeds their fair share (their stage's visit budget split by speed); prices of peers
    that stay over-used grow, so groups negotiate who gets the fast peers and links. The round whose
    routes simulate fastest is kept.

    :param congestion: weight of the over-use price (0 = shortest routes, network-aware but load-oblivious).
    """
    finder = finder or RouteFinder(problem)
    t = problem.tables
    budget = stage_budget(problem)
    groups: list[tuple[int, int]] = []  # (origin, size), round-robin over holders
    per_holder = []
    for h, m in zip(problem.holders, problem.microbatches):
        size = max(1, int(t.memory[h]))
        per_holder.append([min(size, m - k) for k in range(0, m, size)])
    for j in range(max((len(g) for g in per_holder), default=0)):
        for h, sizes in zip(problem.holders, per_holder):
            if j < len(sizes):
                groups.append((h, sizes[j]))
    # Fair share of work per peer: its stage's visit budget, split in proportion to speed.
    share = np.zeros(t.num_peers)
    for s, members in enumerate(finder.members):
        if s == 0 or len(members) == 0:
            continue
        speed = 1.0 / np.maximum(t.forward[members, s], 1e-12)
        share[members] = budget[s] * speed / speed.sum() * finder.work[members, s]
    share = np.maximum(share, 1e-9)
    history = np.zeros(t.num_peers)
    chosen: list[PlannedRoute | None] = [None] * len(groups)
    usage = np.zeros(t.num_peers)
    counts = np.zeros_like(budget)
    best_routes: list[PlannedRoute] = []
    best_score = float("inf")
    present = congestion
    for _ in range(max(1, rounds)):
        for gi, (origin, size) in enumerate(groups):
            old = chosen[gi]
            if old is not None:
                for s, v in zip(old.stages, old.nodes):
                    usage[v] -= size * finder.work[v, s]
                    counts[s] -= size
            # Price of a peer: its history of over-use plus the over-use this group would cause there.
            added = size * finder.work.max(axis=1)
            over = np.maximum(0.0, usage + added - share) / share
            penalty = congestion * size * finder.work.mean() * (history + present * over)

            def allowed(seq: tuple[int, ...], size: int = size) -> bool:
                return all(counts[s] + size <= budget[s] for s in seq)

            ranked = finder.ranked(origin, penalty, allowed=allowed)
            if not ranked:
                ranked = finder.ranked(origin, penalty)
                ranked.sort(key=lambda x: (sum(max(0, counts[s] + size - budget[s]) for s in x[1]), x[0]))
            _, seq, nodes = ranked[0]
            chosen[gi] = PlannedRoute(origin, seq, nodes)
            for s, v in zip(seq, nodes):
                usage[v] += size * finder.work[v, s]
                counts[s] += size
        routes = [r for r, (_, size) in zip(chosen, groups) for _ in range(size)]
        score, _ = evaluate(problem, routes, priority)
        if score < best_score or not best_routes:  # keep a plan even if every round deadlocks in simulation
            best_score, best_routes = score, routes
        overuse = np.maximum(0.0, usage - share) / share
        if not np.any(overuse > 1e-6) and congestion > 0:
            break
        history += overuse
        present *= 1.6
    return _interleave(best_routes, problem)


def construct_by_capacity(problem: PathProblem, *, finder: RouteFinder, group_size: int | None = None
                          ) -> list[PlannedRoute]:
    """Most-constrained-first greedy: holders whose best route is slowest choose first, each group taking
    its fastest route whose peers still have room (their fair share of visits) and whose stages still
    have visit budget. Falls back to the least over-full route when nothing fits.
    """
    t = problem.tables
    budget = stage_budget(problem)
    counts = np.zeros_like(budget)
    room = np.zeros(t.num_peers)
    for s, members in enumerate(finder.members):
        if s == 0 or len(members) == 0:
            continue
        speed = 1.0 / np.maximum(t.forward[members, s], 1e-12)
        room[members] = budget[s] * speed / speed.sum()
    zero = np.zeros(t.num_peers)
    best_iso = {h: finder.ranked(h, zero)[0][0] if finder.sequences else 0.0 for h in problem.holders}
    groups: list[tuple[int, int]] = []
    for h, m in sorted(zip(problem.holders, problem.microbatches), key=lambda x: -best_iso[x[0]]):
        size = group_size or m
        groups += [(h, min(size, m - k)) for k in range(0, m, size)]
    routes: list[PlannedRoute] = []
    for origin, size in groups:
        blocked = np.where(room + 1e-9 >= size, 0.0, 1e6)
        ranked = finder.ranked(origin, blocked,
                               allowed=lambda seq: all(counts[s] + size <= budget[s] for s in seq))  # noqa: B023
        if not ranked or ranked[0][0] >= 1e6:
            over = np.maximum(0.0, size - room) * finder.work.mean()
            ranked = finder.ranked(origin, over)
            ranked.sort(key=lambda x: (sum(max(0, counts[s] + size - budget[s]) for s in x[1]), x[0]))
        _, seq, nodes = ranked[0]
        for s, v in zip(seq, nodes):
            counts[s] += size
            room[v] -= size
        routes += [PlannedRoute(origin, seq, nodes)] * size
    return _interleave(routes, problem)


def _interleave(routes: list[PlannedRoute], problem: PathProblem) -> list[PlannedRoute]:
    """Injection order: round-robin over data holders, each holder's microbatches in planned order."""
    by_holder: dict[int, list[PlannedRoute]] = {h: [] for h in problem.holders}
    for r in routes:
        by_holder[r.origin].append(r)
    out = []
    for j in range(max((len(v) for v in by_holder.values()), default=0)):
        for h in problem.holders:
            if j < len(by_holder[h]):
                out.append(by_holder[h][j])
    return out


def repair_balance(problem: PathProblem, routes: list[PlannedRoute], finder: RouteFinder) -> list[PlannedRoute]:
    """Move visits from over-budget to under-budget stages until every stage is within its budget."""
    budget = stage_budget(problem)
    zero = np.zeros(problem.tables.num_peers)
    for _ in range(len(routes) * problem.rules.num_stages):
        counts = np.zeros_like(budget)
        for r in routes:
            counts[list(r.stages)] += 1
        over = [s for s in range(1, len(budget)) if counts[s] > budget[s]]
        under = [s for s in range(1, len(budget)) if counts[s] < budget[s]]
        if not over or not under:
            break
        best = None
        for i, r in enumerate(routes):
            for x in over:
                if x not in r.stages:
                    continue
                for y in under:
                    if y in r.stages:
                        continue
                    target = sorted(set(r.stages) - {x} | {y})
                    options = [seq for seq in finder.sequences if sorted(seq) == target]
                    for seq in options:
                        score, nodes = finder.best_nodes(r.origin, seq, zero)
                        if best is None or score < best[0]:
                            best = (score, i, seq, nodes)
        if best is None:
            break
        _, i, seq, nodes = best
        routes[i] = PlannedRoute(routes[i].origin, seq, nodes)
    return routes


def evaluate(problem: PathProblem, routes: list[PlannedRoute], priority: Priority, *, draws: int = 0
             ) -> tuple[float, SimResult]:
    """Objective: simulated makespan, ties broken by the mean finish time (a gradient on plateaus).

    :param draws: score the mean makespan over this many simulations with the tables' measured jitter instead of
        the on-time one (the same draws for every candidate, so that they are compared on equal terms). The result
        returned is the on-time simulation either way.
    """
    sims = to_sim_routes(routes)
    res = simulate(problem.tables, sims, priority=priority)
    if res.deadlocked:
        return float("inf"), res
    makespan = res.makespan
    if draws > 0 and problem.tables.jitter is not None and len(problem.tables.jitter) > 0:
        rng = np.random.default_rng(JITTER_SEED)
        makespan = float(np.mean([simulate(problem.tables, sims, priority=priority, rng=rng).makespan
                                  for _ in range(draws)]))
    return makespan + 1e-3 * float(np.mean(list(res.finish.values()))), res


def local_search(problem: PathProblem, routes: list[PlannedRoute], *, rng: np.random.Generator, iterations: int,
                 priority: Priority = "backward_first", finder: RouteFinder | None = None,
                 patience: int | None = None, draws: int = 0) -> PathPlan:
    """Improve `routes` on the simulated makespan (the expected one over `draws` jittered simulations, see
    `evaluate`), keeping stage counts (balance) unchanged."""
    finder = finder or RouteFinder(problem)
    routes = list(routes)
    best, res = evaluate(problem, routes, priority, draws=draws)
    history = [res.makespan]
    improvements = 0
    patience = patience or max(60, iterations // 3)
    stale = 0
    it = 0
    n = problem.tables.num_peers
    inject_step = float(np.median(problem.tables.forward[list(problem.holders), 0])) if problem.holders else 1.0
    for it in range(1, iterations + 1):  # noqa: B007 (reported after the loop)
        if stale >= patience or len(routes) == 0:
            break
        move = rng.random()
        candidate = list(routes)
        # Bias towards microbatches that finish late: they set the makespan.
        finish = np.array([res.finish.get(i, np.inf) for i in range(len(routes))])
        late = np.argsort(-finish)[: max(3, len(routes) // 4)]
        i = int(rng.choice(late)) if rng.random() < 0.7 else int(rng.integers(len(routes)))
        r = routes[i]
        if move < 0.5:
            # Re-route microbatch i on the same stage set (order and peers may change).
            load = _loads(routes, finder, n, skip=i)
            penalty = rng.uniform(0, 1.0) * load / max(1, len(routes) / max(1, len(problem.holders)))
            same = sorted(r.stages)
            ranked = finder.ranked(r.origin, penalty, allowed=lambda seq: sorted(seq) == same)  # noqa: B023
            ranked = [x for x in ranked if (x[1], x[2]) != (r.stages, r.nodes)]
            if not ranked:
                stale += 1
                continue
            _, seq, nodes = ranked[min(int(rng.integers(3)), len(ranked) - 1)]
            candidate[i] = PlannedRoute(r.origin, seq, nodes, r.inject_at)
        elif move < 0.8:
            # Exchange one stage between microbatch i and another microbatch j.
            j = int(rng.integers(len(routes)))
            q = routes[j]
            xs = sorted(set(r.stages) - set(q.stages))
            ys = sorted(set(q.stages) - set(r.stages))
            if i == j or not xs or not ys:
                stale += 1
                continue
            x, y = int(rng.choice(xs)), int(rng.choice(ys))
            zero = np.zeros(n)
            new_r = _best_with_stages(finder, r.origin, set(r.stages) - {x} | {y}, zero)
            new_q = _best_with_stages(finder, q.origin, set(q.stages) - {y} | {x}, zero)
            if new_r is None or new_q is None:
                stale += 1
                continue
            new_r.inject_at, new_q.inject_at = r.inject_at, q.inject_at
            candidate[i], candidate[j] = new_r, new_q
        elif move < 0.93:
            # Delay or advance microbatch i's injection (collision avoidance by timing).
            if rng.random() < 0.4:  # re-time this holder's whole first wave at once
                own = [k for k, q in enumerate(routes) if q.origin == r.origin][: int(problem.tables.memory[r.origin])]
                offsets = np.sort(rng.choice(np.arange(0, 8.5, 0.5) * inject_step, size=len(own)))
                offsets -= offsets[0]
                for k, off in zip(own, offsets):
                    q = routes[k]
                    candidate[k] = PlannedRoute(q.origin, q.stages, q.nodes, float(off))
                new_t = candidate[i].inject_at
            elif rng.random() < 0.3:  # line up with another microbatch of the same holder
                new_t = float(rng.choice([q.inject_at for q in routes if q.origin == r.origin]))
            else:
                new_t = r.inject_at + float(rng.choice([-4.0, -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 4.0])) * inject_step
            candidate[i] = PlannedRoute(r.origin, r.stages, r.nodes, max(0.0, new_t))
            if all(a.inject_at == b.inject_at for a, b in zip(candidate, routes)):
                stale += 1
                continue
        else:
            # Swap the injection order of two microbatches of the same data holder.
            same_origin = [k for k, q in enumerate(routes) if q.origin == r.origin and k != i]
            if not same_origin:
                stale += 1
                continue
            j = int(rng.choice(same_origin))
            q = routes[j]
            candidate[i] = PlannedRoute(q.origin, q.stages, q.nodes, r.inject_at)
            candidate[j] = PlannedRoute(r.origin, r.stages, r.nodes, q.inject_at)
        score, cres = evaluate(problem, candidate, priority, draws=draws)
        if score < best - 1e-9:
            routes, best, res = candidate, score, cres
            improvements += 1
            stale = 0
        else:
            stale += 1
        history.append(res.makespan)
    return PathPlan(routes=routes, result=res, iterations=it, improvements=improvements, history=history)


def _loads(routes: list[PlannedRoute], finder: RouteFinder, n: int, skip: int = -1) -> np.ndarray:
    load = np.zeros(n)
    for k, r in enumerate(routes):
        if k == skip:
            continue
        load[r.origin] += finder.work[r.origin, 0]
        for s, v in zip(r.stages, r.nodes):
            load[v] += finder.work[v, s]
    return load


def _best_with_stages(finder: RouteFinder, origin: int, stages: set[int], penalty: np.ndarray) -> PlannedRoute | None:
    target = sorted(stages)
    ranked = finder.ranked(origin, penalty, allowed=lambda seq: sorted(seq) == target)
    if not ranked:
        return None
    _, seq, nodes = ranked[0]
    return PlannedRoute(origin, seq, nodes)


def stagger(routes: list[PlannedRoute], problem: PathProblem, unit: np.ndarray, factor: float, lead: bool = False
            ) -> list[PlannedRoute]:
    """Spread each holder's first wave (as many microbatches as it has memory) `factor * unit` apart, so
    microbatches reach shared relays at different times (TC2). With `lead`, the first microbatch goes
    alone and the rest of the wave together `factor * unit` later (its backward then overlaps their forward)."""
    seen: dict[int, int] = {}
    out = []
    for r in routes:
        j = seen.get(r.origin, 0)
        seen[r.origin] = j + 1
        wave = int(problem.tables.memory[r.origin])
        slot = j % wave
        step = (1 if slot else 0) if lead else slot
        out.append(PlannedRoute(r.origin, r.stages, r.nodes, step * factor * float(unit[r.origin])))
    return out


def plan_paths(problem: PathProblem, *, seed: int = 0, iterations: int = 400, collision_aware: bool = True,
               congestion: float = 1.0, priority: Priority = "backward_first", jitter_draws: int = 0,
               jitter_polish: int = 0) -> PathPlan:
    """Routes for every microbatch of `problem`.

    :param collision_aware: refine on the simulated makespan (TC2); without it, the priority-planned routes
        (isolated times and load only) are returned as they are.
    :param iterations: local-search moves (deterministic budget, so the plan depends only on the seed).
    :param jitter_polish: when the tables carry measured jitter, this many more moves scored on the mean makespan
        over `jitter_draws` jittered simulations (`evaluate`), after the on-time search.
    """
    rng = np.random.default_rng(seed)
    in_order = problem.rules.stages_per_path == problem.rules.num_stages
    finder = RouteFinder(problem, in_order_only=in_order)
    candidates = [construct(problem, congestion=congestion, finder=finder, priority=priority)]
    for size in sorted({max(problem.microbatches, default=1), int(problem.tables.memory.min())}):
        candidates.append(construct_by_capacity(problem, finder=finder, group_size=size))
    candidates = [repair_balance(problem, c, finder) for c in candidates]
    if collision_aware:
        unit = (1 + problem.tables.backward_factor) * problem.tables.forward[:, 0] + problem.tables.loss_times()
        candidates = [stagger(c, problem, unit, f, lead) for c in candidates for f in (0.0, 0.5, 1.0, 1.5, 2.0)
                      for lead in (False, True)]
    routes = min(candidates, key=lambda c: evaluate(problem, c, priority)[0])
    for r in routes:
        why = path_violation(r.stages, problem.rules)
        if why is not None:  # our own invariant: the finder only yields valid sequences
            raise AssertionError(why)
    if not collision_aware:
        _, res = evaluate(problem, routes, priority)
        return PathPlan(routes=routes, result=res)
    plan = local_search(problem, routes, rng=rng, iterations=iterations, priority=priority, finder=finder)
    if jitter_polish > 0 and jitter_draws > 0 and problem.tables.jitter is not None and len(problem.tables.jitter):
        # the on-time search packs microbatches as tightly as the simulator allows; where messages jitter, a
        # packing that leaves a little slack at the meeting points finishes sooner on average
        polished = local_search(problem, plan.routes, rng=rng, iterations=jitter_polish, priority=priority,
                                finder=finder, draws=jitter_draws)
        plan = PathPlan(routes=polished.routes, result=polished.result,
                        iterations=plan.iterations + polished.iterations,
                        improvements=plan.improvements + polished.improvements,
                        history=plan.history + polished.history)
    return plan
