"""Same-stage gradient averaging, weighted by the microbatches each peer actually processed.

A stage group's gradient is sum over its peers of their gradient sums, divided by the total number
of microbatches that visited the stage: every microbatch weighs the same, whichever peer served it,
and a peer that served none contributes nothing. This is the in-process version; the networked
runtime reaches the same mean with an all-reduce of (mean gradient x visits) weighted by visits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peers.worker import StageWorker, WorkerError


def mean_by_visits(sums: Sequence[torch.Tensor], visits: Sequence[int]) -> tuple[torch.Tensor, int]:
    """sum(sums) / sum(visits), added in the order given (zeros when nobody was visited), and the total visits.

    Callers that must agree bit for bit (the peers of a stage group) pass the sums in one agreed order.
    """
    if not sums or len(sums) != len(visits):
        raise ValueError("need one visit count per gradient sum, and at least one peer")
    total = int(sum(visits))
    acc = torch.zeros_like(sums[0])
    for s in sums:
        acc.add_(s)
    return (acc / total if total else acc), total


def visit_weighted_mean(sums: Sequence[dict[str, torch.Tensor]], visits: Sequence[int]
                        ) -> tuple[dict[str, torch.Tensor], int]:
    """Mean gradient of a stage group from each peer's gradient sum and visit count.

    :returns: the mean by parameter name (zeros when nobody was visited) and the total visits
    """
    if not sums or len(sums) != len(visits):
        raise ValueError("need one visit count per gradient sum, and at least one peer")
    mean = {name: mean_by_visits([s[name] for s in sums], visits)[0] for name in sums[0]}
    return mean, int(sum(visits))


def average_stage(workers: Sequence[StageWorker]) -> int:
    """Install the visit-weighted mean gradient on every worker of one stage; returns the total visits."""
    stages = {w.stage for w in workers}
    if len(stages) != 1:
        raise WorkerError(f"averaging needs workers of one stage, got stages {sorted(stages)}")
    mean, total = visit_weighted_mean([w.gradient_sums() for w in workers], [w.visits for w in workers])
    for w in workers:
        w.set_mean_gradients(mean, total)
    return total
