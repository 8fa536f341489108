"""Byzantine-robust means of a stage group's gradients: CenteredClip, and the check against the group's history.

`centered_clip` is CenteredClip (Karimireddy, He and Jaggi 2021), the aggregator of BTARD (Gorbunov et al. 2022):
from a robust start it repeatedly moves the centre by the weighted mean of each member's offset, each offset
clipped to a radius tau. A member far away then moves the result by at most its weight over the others' weight,
times tau, whatever it sent, so one faulty member of three or more cannot drag the mean away. We chose it over a
coordinate-wise median or trimmed mean because when every member lies within tau of the start its first step *is*
the weighted mean: an honest group installs exactly the visit-weighted mean it installed before (a median of three
ignores the visit weights and is a noisier estimate than the mean), and deciding that costs one pass over the
gradients.

- start: the member whose median distance to the others is smallest (an honest one while faulty members are fewer
  than half; unlike the mean, one huge value cannot move it);
- tau: `CLIP_RADIUS` times the median of the members' median distances to one another (an honest distance), so it
  follows the group's own spread and needs no tuning per model;
- stop: at the first step that clips nobody (that step lands on the weighted mean), once a step moves the centre
  by less than `CLIP_TOLERANCE` x tau, or after `CLIP_ITERATIONS`.

`far_outside` is the other guard: a member whose mean gradient is `OUTLIER_FACTOR` times larger than the norm of the
gradients the group installed recently is refused. It also covers groups of two, where nobody can be out-voted.

Every member of a group must install bit-identical gradients, so everything here is deterministic for the same
inputs in the same order: tensors are combined in the order given with exactly rounded elementwise arithmetic (no
fused multiply-adds, which some CPUs have and others lack). Whether anyone is far away is screened with float32 dot
products (`gram`: one pass, ~1 ms for 1.6M parameters x 3 members); another summation order (thread count, vector
width) could change that answer only for a member within float32 rounding of the boundary. Once somebody is far,
the distances that feed the result are recomputed exactly: differences accumulated in float64 and rounded to
float32 (`vector_norm`), so that no summation order changes a bit of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

CLIP_RADIUS = 2.0
"""tau, in multiples of the members' median distance to one another."""
CLIP_ITERATIONS = 20
"""Most CenteredClip steps per round; each leaves about the clipped members' weight share (1/3 for one of three) of
the distance to the fixed point."""
CLIP_TOLERANCE = 1e-3
"""CenteredClip stops once a step moves the centre by less than this fraction of tau."""
OUTLIER_FACTOR = 100.0
"""A member's mean gradient this many times the norm of the group's recent gradients is far outside its history
(honest members of the tiny model reached 38x in gradient spikes)."""
CHUNK = 1 << 16
"""Elements cast to float64 at a time: casting a whole gradient at once costs a large allocation, 4x the time."""


def _f32(x: float) -> float:
    """`x` rounded to float32: float64 sums taken in another order still give the same value (but at a tie)."""
    return float(torch.tensor(x, dtype=torch.float32)) if math.isfinite(x) else math.inf


def vector_norm(x: torch.Tensor) -> float:
    """L2 norm of `x`, accumulated in float64 (no overflow for any float32 input) and rounded to float32."""
    flat = x.reshape(-1)
    squares = [part.double().square_().sum() for part in flat.split(CHUNK)]
    return _f32(math.sqrt(float(torch.stack(squares).sum()))) if squares else 0.0


def gram(vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The float64 matrix of dot products of `vectors` (equal shapes), for screening: float32 dot products, fast
    (one BLAS call each), or float64 ones where a float32 product overflows (a huge vector)."""
    flats = [v.reshape(-1) for v in vectors]
    n = len(flats)
    g = torch.empty((n, n), dtype=torch.float64)
    for i in range(n):
        for j in range(i, n):
            g[i, j] = g[j, i] = float(torch.dot(flats[i], flats[j]))
    for i, j in zip(*torch.nonzero(~torch.isfinite(g), as_tuple=True), strict=True):
        g[i, j] = sum(float(a.double().mul_(b.double()).sum())
                      for a, b in zip(flats[i].split(CHUNK), flats[j].split(CHUNK), strict=True))
    return g


def norms_and_distances(g: torch.Tensor, weights: Sequence[float]) -> tuple[list[float], list[list[float]]]:
    """From the Gram matrix `g` of sums s_i: the norms of the points s_i / w_i and their pairwise distances."""
    n = len(weights)
    sq = [float(g[i, i]) / weights[i] ** 2 for i in range(n)]
    apart = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            d2 = sq[i] + sq[j] - 2.0 * float(g[i, j]) / (weights[i] * weights[j])
            apart[i][j] = apart[j][i] = _f32(math.sqrt(max(0.0, d2)))
    return [_f32(math.sqrt(s)) for s in sq], apart


@dataclass(frozen=True)
class Clipped:
    center: torch.Tensor
    """The aggregate, per unit of weight."""
    clipped: tuple[int, ...]
    """Indices of the members whose offset was clipped in the last step (their influence bounded)."""
    steps: int
    """CenteredClip steps taken (0: every member was within tau of the start, the result is the weighted mean)."""


def centered_clip(sums: Sequence[torch.Tensor], weights: Sequence[int], *, g: torch.Tensor | None = None,
                  radius: float = CLIP_RADIUS, iterations: int = CLIP_ITERATIONS) -> Clipped:
    """CenteredClip of the points sums[i] / weights[i] with weights `weights` (all > 0).

    When a step clips nobody, the result is sum(sums) / sum(weights), computed as the plain weighted mean is, so an
    honest group gets the same bits as without the defence.

    :param sums: one vector per member, its weight times its mean
    :param g: `gram(sums)`, when the caller has it already
    :param radius: tau in multiples of the members' median distance to one another
    """
    if not sums or len(sums) != len(weights) or min(weights) <= 0:
        raise ValueError("need at least one member, each with a positive weight")
    n, total = len(sums), float(sum(weights))
    _, apart = norms_and_distances(gram(sums) if g is None else g, [float(w) for w in weights])
    start, tau = _start_and_radius(apart, radius)
    if all(d <= tau for d in apart[start]):
        return Clipped(_weighted_mean(sums, total), (), 0)
    # somebody is far away (an attack, or a gradient spike): the distances again, exactly, then iterate
    points = [s / w for s, w in zip(sums, weights, strict=True)]
    offset, move = torch.empty_like(points[0]), torch.empty_like(points[0])
    for i in range(n):
        for j in range(i + 1, n):
            apart[i][j] = apart[j][i] = vector_norm(torch.sub(points[i], points[j], out=offset))
    start, tau = _start_and_radius(apart, radius)
    center = points[start].clone()
    clipped: tuple[int, ...] = ()
    for step in range(iterations):
        norms = [vector_norm(torch.sub(p, center, out=offset)) for p in points]
        clipped = tuple(i for i, d in enumerate(norms) if d > tau)
        if not clipped:
            return Clipped(_weighted_mean(sums, total), (), step)
        move.zero_()
        for i, (p, w) in enumerate(zip(points, weights, strict=True)):
            share = w / total * (tau / norms[i] if i in clipped else 1.0)
            move.add_(torch.sub(p, center, out=offset).mul_(share))
        center.add_(move)
        if vector_norm(move) <= CLIP_TOLERANCE * tau:
            return Clipped(center, clipped, step + 1)
    return Clipped(center, clipped, iterations)


def far_outside(norms: Sequence[float], reference: float | None, factor: float = OUTLIER_FACTOR) -> list[bool]:
    """Which of `norms` exceed `factor` times `reference`, the norm of the group's recent gradients (None or 0: no
    history yet, nothing is far outside)."""
    if not reference or reference <= 0:
        return [False] * len(norms)
    limit = factor * reference
    return [n > limit for n in norms]


def _start_and_radius(apart: list[list[float]], radius: float) -> tuple[int, float]:
    """The member whose median distance to the others is smallest, and tau: `radius` times the median of those."""
    n = len(apart)
    spread = [_lower_median([apart[i][j] for j in range(n) if j != i]) for i in range(n)]
    return min(range(n), key=lambda i: (spread[i], i)), radius * _lower_median(spread)


def _lower_median(values: Sequence[float]) -> float:
    return sorted(values)[(len(values) - 1) // 2] if values else 0.0


def _weighted_mean(sums: Sequence[torch.Tensor], total: float) -> torch.Tensor:
    acc = torch.zeros_like(sums[0])
    for s in sums:
        acc.add_(s)
    return acc / total
