"""`trained`: a stage worker of a micro model with gradient sums to average, for the stage-group averaging tests."""

from __future__ import annotations

import torch

from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker

MICRO = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
SPLIT = (2, 1, 1)


def trained(peer: str, visits: int, seed: int) -> StageWorker:
    """A stage-1 worker that ran `visits` microbatches of random activations forward and backward."""
    w = StageWorker(peer, 1, MICRO, SPLIT, OptimConfig(grad_clip=0), seed=0)
    gen = torch.Generator().manual_seed(seed)
    for mb in range(visits):
        out = w.forward(mb, torch.randn(2, 8, MICRO.dim, generator=gen))
        w.backward(mb, torch.randn(out.shape, generator=gen))
    return w
