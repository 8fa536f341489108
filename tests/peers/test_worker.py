import pytest
import torch
from peers_util import MICRO

from peers.optim import OptimConfig, lr_at
from peers.worker import MemoryLimitError, StageWorker, WorkerError

SPLIT = (2, 1, 1)


def worker(stage: int, **kw) -> StageWorker:
    return StageWorker(f"p{stage}", stage, MICRO, SPLIT, OptimConfig(grad_clip=0), **kw)


def act(b: int = 2, t: int = 8, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(b, t, MICRO.dim, dtype=dtype)


def still_usable(w: StageWorker) -> None:
    """A full forward/backward round trip works and leaves nothing stashed."""
    before = w.stashed
    mb = 10_000 + len(before)
    out = w.forward(mb, act())
    assert w.backward(mb, torch.ones_like(out)).shape == out.shape
    assert w.stashed == before


@pytest.mark.parametrize("call, match", [
    (lambda w: w.forward(0, act(t=8)[..., :-1]), "must be"),                       # wrong width
    (lambda w: w.forward(0, act(t=MICRO.max_seq_len + 1)), "must be"),             # too long
    (lambda w: w.forward(0, act(dtype=torch.float64)), "dtype"),                   # wrong dtype
    (lambda w: w.forward(0, torch.full((2, 8, MICRO.dim), float("nan"))), "non-finite"),
    (lambda w: w.forward(0, [[1.0]]), "tensor"),                                   # not a tensor
    (lambda w: w.forward(-1, act()), "non-negative"),                              # bad id
    (lambda w: w.forward(0, act(), stage=2), "serves stage 1, not stage 2"),       # a stage it does not own
    (lambda w: w.backward(77, act()), "no stashed forward"),                       # unknown microbatch
    (lambda w: w.inject(0, torch.zeros(2, 9, dtype=torch.long)), "data holder"),   # stage-0 call on stage 1
])
def test_bad_input_raises_clearly_and_leaves_worker_usable(call, match):
    w = worker(1)
    w.forward(5, act())  # one legitimately stashed microbatch must survive the bad call
    with pytest.raises(WorkerError, match=match):
        call(w)
    assert w.stashed == [5]
    still_usable(w)


def test_gradient_of_wrong_shape_is_refused_and_the_stash_kept():
    w = worker(1)
    out = w.forward(3, act())
    with pytest.raises(WorkerError, match="shape"):
        w.backward(3, torch.ones(2, 7, MICRO.dim))
    assert w.stashed == [3]
    w.backward(3, torch.ones_like(out))
    assert w.visits == 1


def test_memory_limit_refuses_one_more_activation():
    w = worker(2, memory_slots=2)
    outs = [w.forward(i, act()) for i in range(2)]
    with pytest.raises(MemoryLimitError, match="memory limit is 2"):
        w.forward(2, act())
    w.backward(0, torch.ones_like(outs[0]))
    with pytest.raises(WorkerError, match="already stashed"):
        w.forward(1, act())
    w.forward(2, act())  # a slot freed by the backward of microbatch 0
    assert sorted(w.stashed) == [1, 2]
    assert w.drop(1) and not w.drop(1)


def test_stage0_checks_tokens_and_origin():
    w = worker(0)
    with pytest.raises(WorkerError, match="token ids"):
        w.inject(0, torch.full((2, 9), MICRO.vocab_size))
    with pytest.raises(WorkerError, match="integer tensor"):
        w.inject(0, torch.zeros(2, 9))
    with pytest.raises(WorkerError, match="not injected"):
        w.loss(4, act())
    with pytest.raises(WorkerError, match="inject"):
        w.forward(0, act())
    h = w.inject(0, torch.randint(0, MICRO.vocab_size, (2, 9)))
    with pytest.raises(WorkerError, match="shape"):
        w.loss(0, h[:, :4])
    loss, g = w.loss(0, h)
    assert loss > 0 and g.shape == h.shape
    assert w.backward(0, g) is None and w.visits == 1


def test_accumulated_gradient_is_normalised_by_visits():
    """Two microbatches: the stepped gradient is their sum / 2, not the sum, not /group size."""
    w = worker(1)
    xs = [act() for _ in range(2)]
    gs = [torch.randn(2, 8, MICRO.dim) for _ in range(2)]
    singles = []
    for x, g in zip(xs, gs, strict=True):
        probe = worker(1)
        probe.forward(0, x)
        probe.backward(0, g)
        singles.append(probe.gradient_sums())
    for i, (x, g) in enumerate(zip(xs, gs, strict=True)):
        w.forward(i, x)
        w.backward(i, g)
    sums = w.gradient_sums()
    for name in sums:
        assert torch.allclose(sums[name], singles[0][name] + singles[1][name], atol=1e-6)
    expected_norm = torch.norm(torch.stack([(s / 2).norm() for s in sums.values()]))
    stats = w.step()
    assert stats.visits == 2 and stats.step == 1
    assert abs(stats.grad_norm - float(expected_norm)) < 1e-5 * float(expected_norm)


def test_a_requeued_microbatch_passes_its_gradient_on_without_counting_it_again():
    """accumulate=False (a stage that already holds the microbatch): the same gradient for the previous hop, no
    change to the sums or the visits."""
    w, x, g = worker(1), act(), torch.randn(2, 8, MICRO.dim)
    w.forward(0, x)
    first = w.backward(0, g)
    sums = w.gradient_sums()
    w.forward(0, x)
    again = w.backward(0, g, accumulate=False)
    assert torch.equal(again, first) and w.visits == 1 and not w.stashed
    for name, value in w.gradient_sums().items():
        assert torch.equal(value, sums[name])
    holder, tokens = worker(0), torch.randint(0, MICRO.vocab_size, (2, 9))
    back = holder.inject(0, tokens)
    loss, grad = holder.loss(0, back)
    head = holder.gradient_sums()
    loss_again, grad_again = holder.loss(0, back, accumulate=False)
    assert loss_again == loss and torch.equal(grad_again, grad)
    for name, value in holder.gradient_sums().items():
        assert torch.equal(value, head[name])
    with pytest.raises(WorkerError, match="stage 0 always accumulates"):
        holder.backward(0, grad, accumulate=False)  # where a microbatch ends, its backward was never counted


def test_step_refused_while_microbatches_are_in_flight():
    w = worker(1)
    w.forward(0, act())
    with pytest.raises(WorkerError, match="still await backward"):
        w.step()
    w.drop(0)
    assert w.step().visits == 0


def test_exactly_one_optimizer_step_per_step_call_with_the_scheduled_lr():
    cfg = OptimConfig(lr=1e-2, warmup_steps=2, total_steps=5)
    w = StageWorker("p", 1, MICRO, SPLIT, cfg)
    for i in range(4):
        out = w.forward(0, act())
        w.backward(0, torch.ones_like(out))
        stats = w.step()
        assert stats.lr == pytest.approx(lr_at(i, cfg))
        steps = {int(s["step"]) for s in w.optimizer.state.values()}
        assert steps == {i + 1}, "AdamW must have stepped exactly once per iteration"
    assert lr_at(0, cfg) == pytest.approx(5e-3) and lr_at(1, cfg) == pytest.approx(1e-2)
    assert lr_at(100, cfg) == pytest.approx(1e-3)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_precisions_keep_fp32_activations_and_step(precision):
    if precision == "fp16" and not torch.cuda.is_available():
        pytest.skip("fp16 autocast is a CUDA path")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    head = StageWorker("h", 0, MICRO, SPLIT, OptimConfig(), precision=precision, device=device)
    h = head.inject(0, torch.randint(0, MICRO.vocab_size, (2, 9)))
    assert h.dtype == torch.float32
    loss, g = head.loss(0, h)
    head.backward(0, g)
    assert loss > 0
    stats = head.step()
    assert not stats.skipped and stats.grad_norm > 0


def test_an_unlearnt_microbatch_leaves_the_sum_and_the_visits_as_without_it():
    """A relay takes a microbatch of a holder the commit left out back out: the sum is the other microbatches'
    alone, up to rounding, and the step is theirs; one not in the sum, or asked twice, changes nothing."""
    kept, xs, gs = worker(1), [act() for _ in range(3)], [torch.randn(2, 8, MICRO.dim) for _ in range(3)]
    w = worker(1)
    for i in (0, 2):
        kept.forward(i, xs[i])
        kept.backward(i, gs[i])
    for i in range(3):
        w.forward(i, xs[i])
        w.backward(i, gs[i])
    assert w.learnt == [0, 1, 2] and w.visits == 3
    assert w.unlearn(1) and not w.unlearn(1) and not w.unlearn(7)
    assert w.learnt == [0, 2] and w.visits == 2
    expected, sums = kept.gradient_sums(), w.gradient_sums()
    for name, value in sums.items():
        assert torch.allclose(value, expected[name], atol=1e-5), name
    w.set_mean_gradients(sums, 2)
    with pytest.raises(WorkerError, match="replaced for averaging"):
        w.unlearn(0)  # the group's mean is in: too late
    assert w.step().visits == 2 and w.learnt == []
    holder = worker(0)
    back = holder.inject(0, torch.randint(0, MICRO.vocab_size, (2, 9)))
    holder.loss(0, back)
    assert holder.learnt == [] and not holder.unlearn(0)  # a holder's own microbatches end where they start
