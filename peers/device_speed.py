"""How fast this machine runs the model: what a peer announces, and what the planner's cost model starts from.

Measured on the peer's own device at join time, on the run's model and microbatch shape, so that heterogeneous
volunteers are planned by what they do rather than by what they claim.
"""

from __future__ import annotations

import statistics
import time

import torch

from peers.model import Block, ModelConfig, Transformer, lm_loss


def measure_seconds_per_layer(model: ModelConfig, batch_size: int, seq_len: int, device: str,
                              repeats: int = 5) -> float:
    """Median forward time of one decoder block for one microbatch on this machine (its compute speed)."""
    torch.manual_seed(0)
    block = Block(model).to(device)
    x = torch.randn(batch_size, seq_len, model.dim, device=device, requires_grad=True)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        y = block(x)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        y.sum().backward()
    return max(statistics.median(times[1:]), 1e-6)


def measure_loss_seconds(model: ModelConfig, batch_size: int, seq_len: int, device: str, repeats: int = 5) -> float:
    """Median time of the loss step (final norm, LM head, cross-entropy and their backward) for one microbatch."""
    torch.manual_seed(0)
    head = Transformer(model, layers=[], with_embedding=False, with_head=True).to(device)
    x = torch.randn(batch_size, seq_len, model.dim, device=device, requires_grad=True)
    targets = torch.randint(0, model.vocab_size, (batch_size, seq_len), device=device)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        lm_loss(head.logits(x), targets).backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return max(statistics.median(times[1:]), 1e-6)
