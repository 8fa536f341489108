"""Same-stage gradient averaging, weighted by the microbatches each peer actually processed, and robust to a liar.

A stage group's gradient is sum over its peers of their gradient sums, divided by the total number
of microbatches that visited the stage: every microbatch weighs the same, whichever peer served it,
and a peer that served none contributes nothing (`mean_by_visits`).

Peers of a swarm are volunteers, so `stage_mean` trusts no member's word:
- a member's weight is bounded by the visits the schedule gave it (`visit_bounds`): a gradient sum claimed over
  2^40 visits counts as a sum over the visits it was scheduled to make;
- a member whose mean gradient is far larger than the gradients the stage installed recently (`history_norm`, kept
  by AdamW's second moment, the same on every member and handed to joiners with the state) is refused;
- with three members or more the rest are combined by CenteredClip (`peers.robust_mean`), so one faulty member
  cannot drag the mean away; an honest group gets exactly the weighted mean.
With two members nobody can be out-voted: the bounded weights and the history check are the defence.

The in-process swarm averages with the plain mean by default (one process trusts itself, and it is the exact
reference the networked runtime is checked against); the networked runtime uses `stage_mean`'s default.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from peers.robust_mean import OUTLIER_FACTOR, centered_clip, far_outside, gram, norms_and_distances
from peers.worker import StageWorker, WorkerError

Aggregation = Literal["centered_clip", "mean"]
"""How a stage group's contributions are combined: CenteredClip (the default), or the plain weighted mean."""


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


def visit_bounds(scheduled: Mapping[str, int], members: Collection[str], heard: Collection[str]) -> dict[str, int]:
    """The most visits each member of a stage group can have processed this iteration.

    Its own scheduled visits, plus those scheduled to the group's members not heard from: a microbatch detoured
    around a gone peer lands on another peer of the same stage. A member the schedule gave nothing gets only that.

    :param scheduled: visits the iteration's schedule gives each peer (`Schedule.visits()`)
    :param members: the stage group, `heard` those whose contributions arrived
    """
    spare = sum(scheduled.get(p, 0) for p in members if p not in heard)
    return {p: scheduled.get(p, 0) + spare for p in members}


def history_norm(worker: StageWorker) -> float | None:
    """Norm of the gradients `worker`'s stage installed recently, in the units of its gradient sums per visit.

    AdamW's bias-corrected second moment holds a moving average (beta2 = 0.95 by default: ~20 steps) of the squared
    installed gradient: its sum is the mean squared norm. Every member holds the same moments (they install the same
    gradients), and a joiner receives them with the stage's state, so every member gets the same reference. Gradients
    are clipped before AdamW sees them, so this is at most `grad_clip`. None before the stage's first step.
    """
    beta2 = worker.optim_config.beta2
    total, seen = 0.0, False
    for p in worker.module.parameters():
        state = worker.optimizer.state.get(p)
        step = float(state["step"]) if state and "step" in state else 0.0
        if step > 0:
            total += float(state["exp_avg_sq"].sum()) / (1.0 - beta2 ** step)
            seen = True
    if not seen or not math.isfinite(total):
        return None
    return math.sqrt(total)  # gradient sums come unscaled (peers.precision), so no loss scale here


@dataclass(frozen=True)
class StageMean:
    """What a stage group installs, and what it refused on the way."""

    mean: torch.Tensor
    """The gradient to install (sum over the accepted members / their total visits; zeros when none)."""
    visits: int
    """Total (bounded) visits behind `mean`."""
    refused: dict[int, str] = field(default_factory=dict)
    """Member index -> why its contribution was left out or cut down (weight above its bound, far outside the
    stage's history, clipped by CenteredClip)."""


def stage_mean(sums: Sequence[torch.Tensor], visits: Sequence[int], *, bounds: Sequence[int] | None = None,
               reference: float | None = None, aggregation: Aggregation = "centered_clip",
               outlier_factor: float = OUTLIER_FACTOR) -> StageMean:
    """The stage group's mean gradient from each member's (finite, well-shaped) gradient sum and claimed visits.

    Deterministic: members that pass the same inputs in the same order install the same bits.

    :param bounds: the most visits each member can have made (`visit_bounds`); None trusts the claims
    :param reference: the norm of the stage's recent gradients (`history_norm`); None skips that check
    :param aggregation: "centered_clip" (tolerates one faulty member in three or more) or "mean" (the plain mean)
    """
    if not sums or len(sums) != len(visits) or (bounds is not None and len(bounds) != len(sums)):
        raise ValueError("need one visit count (and bound) per gradient sum, and at least one peer")
    if aggregation not in ("centered_clip", "mean"):
        raise ValueError(f"aggregation must be 'centered_clip' or 'mean', got {aggregation!r}")
    refused: dict[int, str] = {}
    weights = []
    for i, v in enumerate(visits):
        w = max(0, int(v)) if bounds is None else max(0, min(int(v), int(bounds[i])))
        if v < 0:
            refused[i] = f"refused: claimed {v} visits"
        elif w < v:
            refused[i] = f"weight cut: claimed {v} visits, at most {w} possible"
        weights.append(w)
    contrib = list(sums)  # a sum claimed over more visits than possible counts as a sum over the possible ones
    kept = [i for i, w in enumerate(weights) if w > 0]
    robust = aggregation == "centered_clip" and len(kept) >= 3
    g = gram([contrib[i] for i in kept]) if kept and (robust or reference) else None
    if g is not None and reference:
        norms, _ = norms_and_distances(g, [float(weights[i]) for i in kept])
        far = far_outside(norms, reference, outlier_factor)
        if any(far) and not all(far):
            for i, norm, out in zip(kept, norms, far, strict=True):
                if out:
                    refused[i] = (f"refused: mean gradient norm {norm:.3g}, over {outlier_factor:g}x the stage's "
                                  f"recent {reference:.3g}")
            inside = [k for k, out in enumerate(far) if not out]
            kept, g = [kept[k] for k in inside], g[inside][:, inside]
        elif all(far):
            # the whole group moved: not one member's fault, and refusing everyone would freeze the history for
            # good (it only moves when the stage steps); each is cut down to the edge of the history instead
            for i, norm in zip(kept, norms, strict=True):
                contrib[i] = contrib[i] * (outlier_factor * reference / norm)
            g = gram([contrib[i] for i in kept])
    if not kept:
        return StageMean(torch.zeros_like(sums[0]), 0, refused)
    if aggregation == "centered_clip" and len(kept) >= 3:
        result = centered_clip([contrib[i] for i in kept], [weights[i] for i in kept], g=g)
        for j in result.clipped:
            refused.setdefault(kept[j], "clipped by CenteredClip")
        return StageMean(result.center, sum(weights[i] for i in kept), refused)
    mean, total = mean_by_visits([contrib[i] for i in kept], [weights[i] for i in kept])
    return StageMean(mean, total, refused)


def flat_sums(worker: StageWorker) -> torch.Tensor:
    """`worker`'s gradient sums as one vector in sorted-name order, in their own dtype."""
    sums = worker.gradient_sums()
    return torch.cat([sums[n].reshape(-1) for n in sorted(sums)])


def install(worker: StageWorker, flat: torch.Tensor, visits: int) -> None:
    """Install the flat stage-group mean `flat` (sorted-name order) on `worker`, for `visits` visits."""
    params = dict(worker.module.named_parameters())
    grads, pos = {}, 0
    for name in sorted(params):
        n = params[name].numel()
        grads[name] = flat[pos:pos + n].view(params[name].shape)
        pos += n
    worker.set_mean_gradients(grads, visits)


def average_stage(workers: Sequence[StageWorker], *, aggregation: Aggregation | None = None,
                  scheduled: Mapping[str, int] | None = None) -> int:
    """Install the stage group's mean gradient on every worker of one stage; returns the total visits.

    :param aggregation: None: the plain visit-weighted mean, per parameter in its own dtype (the exact reference);
      otherwise `stage_mean` with that aggregation, the stage's history and, given `scheduled`, bounded weights
    :param scheduled: visits the schedule gave each peer this iteration (`Schedule.visits()`)
    """
    stages = {w.stage for w in workers}
    if len(stages) != 1:
        raise WorkerError(f"averaging needs workers of one stage, got stages {sorted(stages)}")
    if aggregation is None:
        mean, total = visit_weighted_mean([w.gradient_sums() for w in workers], [w.visits for w in workers])
        for w in workers:
            w.set_mean_gradients(mean, total)
        return total
    ordered = sorted(workers, key=lambda w: w.peer_id)
    ids = [w.peer_id for w in ordered]
    bounds = visit_bounds(scheduled, ids, ids) if scheduled is not None else None
    result = stage_mean([flat_sums(w) for w in ordered], [w.visits for w in ordered],
                        bounds=[bounds[p] for p in ids] if bounds is not None else None,
                        reference=history_norm(ordered[0]), aggregation=aggregation)
    for w in ordered:
        install(w, result.mean, result.visits)
    return result.visits
