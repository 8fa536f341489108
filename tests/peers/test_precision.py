"""Precision: what a device may run, the run-wide loss scale across a split backward, fused AdamW."""

import pytest
import torch

from peers.averaging import average_stage
from peers.optim import OptimConfig, build_optimizer
from peers.precision import (
    check_loss_scale,
    peer_precision,
    resolve_precision,
    run_loss_scale,
    scaled_loss,
    unscale_gradients,
)
from peers.train_config import TrainConfig
from peers.worker import StageWorker
from tests.peers.peers_util import MICRO

SPLIT = (2, 1, 1)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="mixed precision and fused AdamW run on CUDA; this machine has none")


# ---- what a device may run -------------------------------------------------------------------
def test_cpu_computes_in_fp32_and_refuses_half_precisions():
    assert resolve_precision("fp32", "cpu") == "fp32"
    assert resolve_precision("auto", "cpu") == "fp32"
    for half in ("bf16", "fp16"):
        with pytest.raises(ValueError, match=f"precision {half} needs a CUDA GPU, this peer computes on cpu"):
            resolve_precision(half, "cpu")
    with pytest.raises(ValueError, match="train.precision must be one of"):
        resolve_precision("fp8", "cpu")


def test_a_peer_may_not_compute_fp16_unless_the_run_scales_its_loss():
    assert peer_precision("fp16", "fp32", "cpu") == "fp32"  # more precise than the run: fine
    assert peer_precision("auto", "auto", "cpu") == "fp32"
    with pytest.raises(ValueError, match="needs a run whose train.precision is fp16"):
        peer_precision("bf16", "fp16", "cpu")
    with pytest.raises(ValueError, match="precision must be one of"):
        peer_precision("auto", "half", "cpu")


# ---- the loss scale as pure functions ----------------------------------------------------------
@pytest.mark.parametrize("bad", [0, 1000, 0.5, float("inf"), float("nan"), 2.0 ** 25, True, "1024"])
def test_loss_scale_must_be_a_power_of_two(bad):
    with pytest.raises(ValueError, match="train.loss_scale must be a power of two"):
        check_loss_scale(bad)


def test_only_fp16_runs_scale_the_loss():
    assert check_loss_scale(1024) == 1024.0 and check_loss_scale(1) == 1.0
    assert run_loss_scale("fp16", 4096.0) == 4096.0
    for precision in ("auto", "fp32", "bf16"):
        assert run_loss_scale(precision, 4096.0) == 1.0
    loss = torch.tensor(2.5)
    assert float(scaled_loss(loss, 8.0)) == 20.0 and scaled_loss(loss, 1.0) is loss


def test_unscale_divides_in_place_and_reports_overflow():
    grads = [torch.full((3,), 2048.0), torch.full((2, 2), -1024.0)]
    assert unscale_gradients(grads, 1024.0)
    assert torch.equal(grads[0], torch.full((3,), 2.0)) and torch.equal(grads[1], torch.full((2, 2), -1.0))
    assert not unscale_gradients([torch.ones(2), torch.tensor([1.0, float("inf")])], 2.0)
    assert unscale_gradients([], 2.0)


# ---- the scale across a split backward (CPU, fp32 compute, exact) --------------------------------
def pipeline_grads(loss_scale: float) -> dict[int, dict[str, torch.Tensor]]:
    """Stage 0 -> 1 -> 2 -> loss at 0 -> backward 2 -> 1 -> 0, every worker with the run's loss scale."""
    workers = [StageWorker(f"p{s}", s, MICRO, SPLIT, OptimConfig(grad_clip=0), loss_scale=loss_scale, seed=3)
               for s in range(3)]
    tokens = torch.randint(0, MICRO.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    h = workers[0].inject(0, tokens)
    h = workers[2].forward(0, workers[1].forward(0, h))
    _, g = workers[0].loss(0, h)
    g = workers[1].backward(0, workers[2].backward(0, g))
    workers[0].backward(0, g)
    return {s: w.gradient_sums() for s, w in enumerate(workers)}


def test_a_power_of_two_loss_scale_is_exact_on_every_stage():
    plain, scaled = pipeline_grads(1.0), pipeline_grads(1024.0)
    for stage in plain:
        for name, g in plain[stage].items():
            assert float(g.norm()) > 0 and torch.equal(scaled[stage][name], g), (stage, name)


def test_an_overflowing_peer_leaves_its_group_consistent():
    """One member's fp16 sums overflow: it drops them, and both members install and step the same mean."""
    a, b = (StageWorker(p, 1, MICRO, SPLIT, OptimConfig(grad_clip=0), loss_scale=1024.0, seed=0) for p in "ab")
    x = torch.randn(2, 8, MICRO.dim, generator=torch.Generator().manual_seed(1))
    for mb in range(2):
        a.forward(mb, x)
        a.backward(mb, torch.full_like(x, 3e38))  # two of these sum past float32's range: an overflow
    b.forward(0, x)
    b.backward(0, torch.ones_like(x))
    assert average_stage([a, b]) == 1  # only b's microbatch counts
    assert a.visits == 0
    stats = [a.step(), b.step()]
    assert not any(s.skipped for s in stats)
    for (name, pa), pb in zip(a.module.named_parameters(), b.module.parameters(), strict=True):
        assert torch.equal(pa, pb), name


def test_gradients_read_for_averaging_take_no_more_backward():
    w = StageWorker("p", 1, MICRO, SPLIT, OptimConfig(), loss_scale=1024.0)
    x = torch.randn(2, 8, MICRO.dim)
    for mb in range(2):
        w.forward(mb, x)
    w.backward(0, torch.ones_like(x))
    w.gradient_sums()
    with pytest.raises(ValueError, match="already read for averaging"):
        w.backward(1, torch.ones_like(x))
    w.drop(1)
    assert not w.step().skipped


def test_fp32_on_cpu_is_unchanged_by_default():
    w = StageWorker("p", 0, MICRO, SPLIT, OptimConfig())
    assert w.precision == "fp32" and w.loss_scale == 1.0 and not w.module.recompute
    assert StageWorker("q", 1, MICRO, SPLIT, OptimConfig(), precision="fp16").loss_scale == 1024.0


# ---- configuration ---------------------------------------------------------------------------------
def test_train_config_refuses_unknown_values():
    with pytest.raises(ValueError, match="train.recompute must be one of auto, blocks, none"):
        TrainConfig.from_dict({"recompute": "sometimes"})
    with pytest.raises(ValueError, match="train.precision must be one of"):
        TrainConfig.from_dict({"precision": "fp64"})
    with pytest.raises(ValueError, match="unknown field"):
        TrainConfig.from_dict({"fused": True})
    with pytest.raises(ValueError, match="loss_scale"):
        TrainConfig.from_dict({"loss_scale": 3})


def test_recompute_defaults_follow_the_model_size():
    auto = TrainConfig()
    assert [auto.recompute_blocks(f) for f in ("tiny", "small", "500m", "1.5b")] == [False, False, True, True]
    assert TrainConfig(recompute="blocks").recompute_blocks("tiny")
    assert not TrainConfig(recompute="none").recompute_blocks("1.5b")


def test_fused_adamw_is_a_cuda_choice():
    with pytest.raises(ValueError, match="optim.fused must be true or false"):
        OptimConfig.from_dict({"fused": "yes"})
    w = StageWorker("p", 1, MICRO, SPLIT, OptimConfig(fused=True))
    assert not w.optimizer.defaults.get("fused")  # CPU parameters: the plain per-parameter loop
    assert w.optimizer.defaults["foreach"] is False


# ---- CUDA (skipped here) ------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cuda_mixed_precision_keeps_fp32_master_weights_and_moments(precision):
    if precision == "bf16" and resolve_precision("auto", "cuda") != "bf16":
        pytest.skip("this GPU has no native bf16")
    head = StageWorker("h", 0, MICRO, SPLIT, OptimConfig(fused=True), precision=precision, device="cuda",
                       recompute=True)
    h = head.inject(0, torch.randint(0, MICRO.vocab_size, (2, 9)))
    assert h.dtype == torch.float32
    loss, g = head.loss(0, h)
    head.backward(0, g)
    assert not head.step().skipped and loss > 0
    assert head.optimizer.defaults["fused"]
    for p in head.module.parameters():
        assert p.dtype == torch.float32
        assert all(v.dtype == torch.float32 for k, v in head.optimizer.state[p].items() if k != "step")


@needs_cuda
def test_cuda_bf16_loss_follows_fp32():
    if resolve_precision("auto", "cuda") != "bf16":
        pytest.skip("this GPU has no native bf16")
    tokens = torch.randint(0, MICRO.vocab_size, (4, 17), generator=torch.Generator().manual_seed(0))
    losses = {}
    for precision in ("fp32", "bf16"):
        w = StageWorker("h", 0, MICRO, (4,), OptimConfig(), precision=precision, device="cuda", seed=0)
        losses[precision] = w.loss(0, w.inject(0, tokens))[0]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)


def test_a_build_optimizer_state_is_fp32_for_fp32_weights():
    w = StageWorker("p", 1, MICRO, SPLIT, OptimConfig())
    opt = build_optimizer(w.module, OptimConfig())
    x = torch.randn(2, 8, MICRO.dim)
    w.forward(0, x)
    w.backward(0, torch.ones_like(x))
    opt.step()
    assert all(v.dtype == torch.float32 for s in opt.state.values() for k, v in s.items() if k != "step")
