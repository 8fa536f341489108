"""The robust stage mean as pure functions: CenteredClip gives an honest group exactly the weighted mean and bounds
what one far member can do; weights are bounded by the schedule; a gradient far outside the stage's history is
refused (or, when the whole group moved, cut down to its edge); the history is AdamW's second moment."""

from __future__ import annotations

import pytest
import torch
from peers_util import MICRO

from peers.averaging import average_stage, history_norm, mean_by_visits, stage_mean, visit_bounds
from peers.optim import OptimConfig
from peers.robust_mean import centered_clip, gram, norms_and_distances, vector_norm
from peers.worker import StageWorker


def honest(n: int, dim: int = 1000, seed: int = 0, spread: float = 0.3) -> list[torch.Tensor]:
    """`n` gradient means around one common direction (norm ~1), each with its own noise."""
    gen = torch.Generator().manual_seed(seed)
    common = torch.randn(dim, generator=gen) / dim ** 0.5
    return [common + spread * torch.randn(dim, generator=gen) / dim ** 0.5 for _ in range(n)]


def test_an_honest_group_gets_exactly_the_weighted_mean():
    points, visits = honest(4), [1, 3, 2, 2]
    sums = [p * v for p, v in zip(points, visits, strict=True)]
    result = centered_clip(sums, visits)
    assert result.steps == 0 and result.clipped == ()
    assert torch.equal(result.center, mean_by_visits(sums, visits)[0])


@pytest.mark.parametrize("fault", ["scaled", "huge"])
def test_one_far_member_of_three_moves_the_result_by_at_most_its_weight_over_the_others_times_tau(fault):
    a, b, c = honest(3)
    bad = c * -1e6 if fault == "scaled" else torch.cat([torch.tensor([3e38]), c[1:]])
    result = centered_clip([a, b, bad], [1, 1, 1])
    honest_mean = (a + b) / 2
    tau = 2.0 * vector_norm(a - b)  # CLIP_RADIUS x the honest members' distance
    assert result.clipped == (2,)
    assert torch.isfinite(result.center).all()
    assert vector_norm(result.center - honest_mean) <= tau * 1 / 2 * 1.01
    assert torch.nn.functional.cosine_similarity(result.center, honest_mean, dim=0) > 0.5  # the plain mean's: -1
    again = centered_clip([a, b, bad], [1, 1, 1])
    assert torch.equal(again.center, result.center)  # deterministic: members agree bit for bit


def test_gram_falls_back_to_float64_where_float32_overflows():
    x = torch.zeros(10)
    x[3] = 3e38
    y = torch.ones(10)
    g = gram([x, y])
    assert torch.isfinite(g).all() and float(g[0, 0]) == pytest.approx(9e76, rel=1e-6)
    norms, apart = norms_and_distances(g, [1.0, 1.0])
    assert norms == pytest.approx([3e38, 10 ** 0.5], rel=1e-6) and apart[0][1] == pytest.approx(3e38, rel=1e-6)


def test_visit_bounds_give_a_silent_members_visits_to_the_others():
    scheduled = {"a": 2, "b": 3, "c": 1}
    assert visit_bounds(scheduled, ["a", "b", "c"], ["a", "b", "c"]) == scheduled
    assert visit_bounds(scheduled, ["a", "b", "c"], ["a", "c"]) == {"a": 5, "b": 6, "c": 4}
    assert visit_bounds(scheduled, ["a", "x"], ["a", "x"]) == {"a": 2, "x": 0}


def test_a_claimed_weight_counts_at_most_its_bound():
    points = honest(3)
    sums, visits = [p * 2 for p in points], [2, 2, 2 ** 40]
    result = stage_mean(sums, visits, bounds=[2, 2, 2])
    assert result.visits == 6 and "weight cut" in result.refused[2]
    torch.testing.assert_close(result.mean, mean_by_visits(sums, [2, 2, 2])[0])


def test_a_gradient_far_outside_the_history_is_refused_and_the_rest_averaged_exactly():
    a, b = honest(2)
    result = stage_mean([a, b * -1e6], [1, 1], reference=1.0)
    assert result.visits == 1 and result.refused[1].startswith("refused: mean gradient norm")
    assert torch.equal(result.mean, a)
    assert stage_mean([a, b * -1e6], [1, 1]).refused == {}  # no history yet: nothing to compare with


def test_when_the_whole_group_is_far_outside_each_is_cut_down_to_the_edge_of_the_history():
    a, b = honest(2)
    result = stage_mean([a * 1e4, b * 1e4], [1, 1], reference=1.0)
    assert result.visits == 2 and result.refused == {}
    assert vector_norm(result.mean) <= 100.0 * 1.0001 and torch.isfinite(result.mean).all()


def test_history_norm_is_the_norm_of_the_installed_gradient_after_one_step():
    w = StageWorker("p", 1, MICRO, (2, 1, 1), OptimConfig(grad_clip=0), seed=0)
    assert history_norm(w) is None
    out = w.forward(0, torch.randn(2, 8, MICRO.dim, generator=torch.Generator().manual_seed(0)))
    w.backward(0, torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    grads = w.gradient_sums()
    w.set_mean_gradients(grads, 1)
    w.step()
    expected = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    assert history_norm(w) == pytest.approx(float(expected), rel=1e-4)


def test_in_process_robust_averaging_of_an_honest_stage_matches_the_plain_mean():
    workers = []
    for i in range(3):
        w = StageWorker(f"p{i}", 1, MICRO, (2, 1, 1), OptimConfig(grad_clip=0), seed=0)
        gen = torch.Generator().manual_seed(7)  # the same microbatch, then one of each member's own
        for mb, seed in enumerate((7, 100 + i)):
            gen = torch.Generator().manual_seed(seed)
            out = w.forward(mb, torch.randn(2, 8, MICRO.dim, generator=gen))
            w.backward(mb, torch.randn(out.shape, generator=gen) * (1.0 if mb == 0 else 0.3))
        workers.append(w)
    plain = [{n: p.clone() for n, p in w.gradient_sums().items()} for w in workers]
    assert average_stage(workers, aggregation="centered_clip", scheduled={w.peer_id: 2 for w in workers}) == 6
    expected = {n: sum(g[n] for g in plain) / 6 for n in plain[0]}
    for w in workers:
        for n, p in w.module.named_parameters():
            torch.testing.assert_close(p.grad, expected[n], rtol=1e-6, atol=1e-8)
