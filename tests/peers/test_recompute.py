"""Activation recomputation: the same gradients as without it, and a stash that keeps one tensor per block."""

import pytest
import torch

from peers.memory_meter import LiveTensorMemory
from peers.model import ModelConfig, Transformer
from peers.optim import OptimConfig
from peers.worker import StageWorker
from tests.peers.peers_util import MICRO

SPLIT = (2, 1, 1)
REL = 1e-6


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).norm()) <= REL * max(float(b.norm()), 1e-30)


def grads_of(worker: StageWorker) -> dict[str, torch.Tensor]:
    return worker.gradient_sums()


def run_stage(stage: int, recompute: bool, microbatches: int = 2) -> tuple[dict[str, torch.Tensor], list]:
    """Forward all microbatches, then backward all (as the pipeline does); parameter gradients and what goes back."""
    w = StageWorker(f"p{stage}", stage, MICRO, SPLIT, OptimConfig(grad_clip=0), recompute=recompute, seed=1)
    gen = torch.Generator().manual_seed(7)
    sent_back = []
    if stage == 0:
        outs = [w.inject(mb, torch.randint(0, MICRO.vocab_size, (2, 9), generator=gen)) for mb in range(microbatches)]
        for mb, h in enumerate(outs):
            loss, g = w.loss(mb, h)
            sent_back.append(torch.tensor(loss))
            w.backward(mb, g)
    else:
        xs = [torch.randn(2, 8, MICRO.dim, generator=gen) for _ in range(microbatches)]
        outs = [w.forward(mb, x) for mb, x in enumerate(xs)]
        for mb, out in enumerate(outs):
            sent_back.append(w.backward(mb, torch.randn(out.shape, generator=gen)))
    return grads_of(w), sent_back


@pytest.mark.parametrize("stage", [0, 1, 2], ids=["first-with-embedding-and-head", "middle", "last"])
def test_recompute_gives_the_same_gradients(stage):
    plain, plain_back = run_stage(stage, recompute=False)
    again, again_back = run_stage(stage, recompute=True)
    assert plain.keys() == again.keys()
    for name in plain:
        assert float(plain[name].norm()) > 0, name
        assert close(again[name], plain[name]), name
    for a, b in zip(again_back, plain_back, strict=True):
        assert close(a, b)


def test_recompute_on_a_reordered_path_and_a_requeued_backward():
    cfg = ModelConfig(vocab_size=64, dim=16, n_layers=5, n_heads=2, ffn_dim=32, max_seq_len=16)
    order = [3, 1, 4]  # a skipping, out-of-order visit of this module's blocks
    results = []
    for recompute in (False, True):
        m = Transformer(cfg, layers=[1, 3, 4], with_embedding=False, with_head=False, seed=2, recompute=recompute)
        x = torch.randn(3, 7, cfg.dim, generator=torch.Generator().manual_seed(0), requires_grad=True)
        out = m.run_layers(x, order)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        (only_input,) = torch.autograd.grad(out, x, g, retain_graph=True)  # what a re-queued backward computes
        out.backward(g)
        results.append((only_input, x.grad, {n: p.grad for n, p in m.named_parameters()}))
    (a_in, a_x, a_p), (b_in, b_x, b_p) = results
    assert close(b_in, a_in) and close(b_x, a_x)
    for name in a_p:
        assert close(b_p[name], a_p[name]), name


def test_recompute_is_off_without_autograd():
    m = Transformer(MICRO, seed=0, recompute=True)
    tokens = torch.randint(0, MICRO.vocab_size, (2, 8))
    with torch.no_grad():
        a = m(tokens)
    m.recompute = False
    with torch.no_grad():
        b = m(tokens)
    assert torch.equal(a, b)


def test_stash_keeps_one_activation_per_block_with_recompute():
    """m stashed microbatches hold each block's input (and the output), not every block's internals."""
    cfg = ModelConfig(vocab_size=64, dim=16, n_layers=6, n_heads=2, ffn_dim=64, max_seq_len=32)
    split, m, batch, seq = (3, 3), 2, 2, 32
    activation = batch * seq * cfg.dim * 4
    held = {}
    for recompute in (False, True):
        w = StageWorker("p", 1, cfg, split, OptimConfig(), recompute=recompute, memory_slots=m)
        xs = [torch.randn(batch, seq, cfg.dim) for _ in range(m)]
        with LiveTensorMemory() as meter:
            outs = [w.forward(mb, x) for mb, x in enumerate(xs)]
            held[recompute] = meter.live - sum(o.untyped_storage().nbytes() for o in outs)
            for mb, out in enumerate(outs):
                w.backward(mb, torch.ones_like(out))
    blocks = split[1]
    # per microbatch: the leaf input, each block's input after the first (outputs of the previous), the output
    assert held[True] <= m * (blocks + 1) * activation * 1.05
    assert held[False] > 4 * held[True]
