"""The iteration time a schedule can expect on a network whose message times jitter.

The simulator's makespan on the links' typical times is what a schedule takes when every message arrives on
time. On a shared or loaded network messages arrive tens of milliseconds early or late; where several microbatches
meet at a peer, that reorders its queue against the plan and the delay compounds along the paths behind it (the
WAN benchmark measured 1.1-1.2x the deterministic makespan for plans that queue a lot). The expectation over
simulations with each message's deviation drawn from the swarm's measured jitter is the prediction that matches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.costs import CostTables
from scheduler.simulator import Priority, SimRoute, simulate

DEFAULT_JITTER_DRAWS = 32
"""Jittered simulations averaged; the mean's spread over seeds is a few percent of the jitter's effect."""


@dataclass(frozen=True)
class ExpectedMakespan:
    """One schedule's iteration time, on time and under the measured jitter."""

    deterministic: float
    """Makespan with every message on its link's typical time."""
    mean: float
    """Mean makespan over the jittered draws (= `deterministic` when no jitter was measured)."""
    p90: float
    """90th percentile of the draws: what a deadline should allow for."""
    draws: int
    """Jittered simulations behind `mean` (0 = no jitter measured)."""


def expected_makespan(tables: CostTables, routes: list[SimRoute], *, draws: int = DEFAULT_JITTER_DRAWS,
                      seed: int = 0, priority: Priority = "backward_first") -> ExpectedMakespan:
    """Simulate `routes` once on time and `draws` times with jittered messages (seeded: the same answer twice)."""
    on_time = float(simulate(tables, routes, priority=priority).makespan)
    if tables.jitter is None or len(tables.jitter) == 0 or draws < 1 or not np.isfinite(on_time):
        return ExpectedMakespan(deterministic=on_time, mean=on_time, p90=on_time, draws=0)
    rng = np.random.default_rng(seed)
    spans = np.array([simulate(tables, routes, priority=priority, rng=rng).makespan for _ in range(draws)])
    return ExpectedMakespan(deterministic=on_time, mean=float(spans.mean()), p90=float(np.quantile(spans, 0.9)),
                            draws=draws)
