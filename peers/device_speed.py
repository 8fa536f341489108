"""How fast this machine runs the model: what a peer announces, and what the planner's cost model starts from.

Measured on the peer's own device at join time, on the run's model and microbatch shape, so that heterogeneous
volunteers are planned by what they do rather than by what they claim.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import Future

import torch

from peers.model import Block, ModelConfig, Transformer, lm_loss
from peers.stage import balanced_split
from scheduler.constants import LOSS_FACTOR

EMULATION_MARGIN = 2.0
"""Compute emulation pads the loss step to at least this multiple of its measured time (load varies)."""


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


def announced_speed(model: ModelConfig, batch_size: int, seq_len: int, device: str, *, stages: int,
                    emulate_seconds_per_layer: float | None = None) -> tuple[float, float]:
    """(seconds per layer, seconds per loss step) a peer announces: measured here, or those of the device it
    emulates (which does what the model says, but never less than this machine can)."""
    loss_seconds = measure_loss_seconds(model, batch_size, seq_len, device)
    if not emulate_seconds_per_layer:
        return measure_seconds_per_layer(model, batch_size, seq_len, device), loss_seconds
    first = balanced_split(model.n_layers, stages)[0]
    return emulate_seconds_per_layer, max(LOSS_FACTOR * emulate_seconds_per_layer * first,
                                          EMULATION_MARGIN * loss_seconds)


def announced_speed_meanwhile(model: ModelConfig, batch_size: int, seq_len: int, device: str, *, stages: int,
                              emulate_seconds_per_layer: float | None = None) -> Future[tuple[float, float]]:
    """`announced_speed`, measured in a thread of its own: a joiner measures while it waits on other processes and
    the network (its transport, its gossip sidecar), and takes the result before it announces itself. The future
    holds what the measurement raised, if it did."""
    future: Future[tuple[float, float]] = Future()

    def measure() -> None:
        try:
            future.set_result(announced_speed(model, batch_size, seq_len, device, stages=stages,
                                              emulate_seconds_per_layer=emulate_seconds_per_layer))
        except BaseException as e:  # handed to whoever takes the result
            future.set_exception(e)

    # not a daemon: a process that exits meanwhile (a run refused) waits for it, rather than tearing down the
    # interpreter under torch's running kernels (which aborts the process: "terminate called without an active
    # exception", exit -6 instead of its own code)
    threading.Thread(target=measure, daemon=False, name="skippipe-speed").start()
    return future
