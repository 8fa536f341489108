"""`PacedWorker`: a stage worker that takes as long as a device of a stated speed would.

Compute emulation for studies on one machine: 12-20 peers sharing two cores cannot show what a swarm of
uneven GPUs does, but each can *take* the time such a GPU would. Every operation runs for real (the weights
train as usual) and is then padded with sleep to the time the planner's cost model gives a device of
`seconds_per_layer`: forward = layers x speed, backward = BACKWARD_FACTOR x forward, and the loss step as
stated (the peer measures it: it depends on the vocabulary more than on the blocks). Padding can only slow
an operation down; one whose real compute already took longer is counted in `overruns` (the emulated speed
was too fast for this machine).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from peers.worker import StageWorker
from scheduler.constants import BACKWARD_FACTOR, LOSS_FACTOR


class PacedWorker(StageWorker):
    """A `StageWorker` whose operations last as long as on a device of `seconds_per_layer`."""

    def __init__(self, *args: Any, seconds_per_layer: float, loss_seconds: float | None = None,
                 **kwargs: Any) -> None:
        """:param loss_seconds: time of the loss step (default: LOSS_FACTOR x the stage's forward)"""
        if not (isinstance(seconds_per_layer, (int, float)) and 0 < seconds_per_layer < 60):
            raise ValueError(f"seconds_per_layer must be in (0, 60), got {seconds_per_layer!r}")
        if loss_seconds is not None and not (isinstance(loss_seconds, (int, float)) and 0 <= loss_seconds < 600):
            raise ValueError(f"loss_seconds must be in [0, 600), got {loss_seconds!r}")
        super().__init__(*args, **kwargs)
        self.seconds_per_layer = float(seconds_per_layer)
        self.forward_seconds = self.seconds_per_layer * self.split[self.stage]
        """The emulated forward time of one microbatch through this stage."""
        self.loss_seconds = LOSS_FACTOR * self.forward_seconds if loss_seconds is None else float(loss_seconds)
        self.overruns = 0
        """Operations whose real compute took longer than the emulated device would have."""

    def _pad(self, start: float, seconds: float) -> None:
        remaining = start + seconds - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        else:
            self.overruns += 1

    def inject(self, microbatch: int, tokens: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out = super().inject(microbatch, tokens)
        self._pad(start, self.forward_seconds)
        return out

    def forward(self, microbatch: int, activation: torch.Tensor, *, stage: int | None = None) -> torch.Tensor:
        start = time.perf_counter()
        out = super().forward(microbatch, activation, stage=stage)
        self._pad(start, self.forward_seconds)
        return out

    def loss(self, microbatch: int, activation: torch.Tensor, *,
             accumulate: bool = True) -> tuple[float, torch.Tensor]:
        start = time.perf_counter()
        out = super().loss(microbatch, activation, accumulate=accumulate)
        self._pad(start, self.loss_seconds)
        return out

    def backward(self, microbatch: int, grad: torch.Tensor, *, stage: int | None = None,
                 accumulate: bool = True) -> torch.Tensor | None:
        start = time.perf_counter()
        out = super().backward(microbatch, grad, stage=stage, accumulate=accumulate)
        self._pad(start, BACKWARD_FACTOR * self.forward_seconds)
        return out

    def unlearn(self, microbatch: int) -> bool:
        start = time.perf_counter()
        out = super().unlearn(microbatch)
        if out:  # a forward recomputed and a backward
            self._pad(start, (1 + BACKWARD_FACTOR) * self.forward_seconds)
        return out
