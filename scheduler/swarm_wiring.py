"""SWARM-style stochastic wiring: every microbatch visits every stage in order, each hop's peer drawn at random.

At each stage the next peer is drawn with probability proportional to its throughput as the current peer observes
it (`swarm_balance.hop_rate`: compute plus the link between them), as SWARM's trainers do (Ryabinin et al. 2023).
The origin is the microbatch's data holder (it owns the sample); the path returns there for the loss.

The runtime executes precomputed paths: a schedule carries one draw of the wiring, so in a live swarm the wiring is
redrawn at each epoch (each re-plan: membership changes, and with this planner every few iterations of a stable
swarm), not for every iteration as in SWARM. `redraw` gives the draw of any iteration from the same seed (what a
per-iteration rewiring would run); `expected_makespan_over_draws` scores the wiring as SWARM runs it, a fresh draw
each iteration, over many draws.
"""

from __future__ import annotations

import numpy as np

from scheduler.paths import PathProblem, PlannedRoute, evaluate
from scheduler.simulator import Priority
from scheduler.swarm_balance import hop_rate

WIRING_SEED_STRIDE = 1_000_003
"""Separates the random streams of different (seed, epoch, iteration) triples."""


def hop_probabilities(problem: PathProblem, sender: int, stage: int) -> tuple[np.ndarray, np.ndarray]:
    """The peers of `stage` and the probability that a microbatch at `sender` goes to each (proportional to its
    rate as `sender` observes it).

    :raises ValueError: the stage has no peer
    """
    members = problem.stage_members()[stage]
    if len(members) == 0:
        raise ValueError(f"stage {stage} has no peer to draw")
    rates = hop_rate(problem.tables, problem.stage_of, sender, members)
    return members, rates / rates.sum()


def draw_routes(problem: PathProblem, rng: np.random.Generator) -> list[PlannedRoute]:
    """One draw of the wiring: each holder's microbatches (interleaved across holders, in injection order) visit
    every served non-zero stage in order, each hop to a peer drawn in proportion to its observed rate.

    :raises ValueError: the problem's rules let paths skip a served stage (a SWARM pipeline visits all)
    """
    stages = tuple(s for s in range(1, problem.rules.num_stages) if s not in problem.rules.unserved)
    if problem.rules.hops != len(stages):
        raise ValueError(f"a SWARM path visits all {len(stages)} served stages; the rules ask for "
                         f"{problem.rules.hops}")
    routes = []
    for j in range(max(problem.microbatches, default=0)):
        for h, m in zip(problem.holders, problem.microbatches):
            if j >= m:
                continue
            nodes, at = [], h
            for s in stages:
                members, p = hop_probabilities(problem, at, s)
                at = int(members[rng.choice(len(members), p=p)])
                nodes.append(at)
            routes.append(PlannedRoute(h, stages, tuple(nodes)))
    return routes


def wiring_rng(seed: int, epoch: int = 0, iteration: int = 0) -> np.random.Generator:
    """The generator of one draw: the same (seed, epoch, iteration) always gives the same wiring."""
    for name, value in (("seed", seed), ("epoch", epoch), ("iteration", iteration)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"wiring {name} must be a non-negative integer, got {value!r}")
    return np.random.default_rng([int(seed), int(epoch), int(iteration), WIRING_SEED_STRIDE])


def redraw(problem: PathProblem, seed: int, epoch: int, iteration: int) -> list[PlannedRoute]:
    """The wiring of `iteration` of `epoch`: reproducible from the seed alone, so every peer could derive it."""
    return draw_routes(problem, wiring_rng(seed, epoch, iteration))


def expected_makespan_over_draws(problem: PathProblem, *, seed: int = 0, draws: int = 16,
                                 priority: Priority = "backward_first") -> np.ndarray:
    """[draws] simulated iteration of independent draws of the wiring (iterations 0..draws-1 of epoch 0): the
    iterations SWARM's per-iteration wiring runs, as a sample."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    return np.array([evaluate(problem, redraw(problem, seed, 0, i), priority)[1].makespan for i in range(draws)])
