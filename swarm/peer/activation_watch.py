"""`ActivationWatch`: a forward whose activations are corrupt breaks its microbatch's attempt at its sender.

A relay that corrupts what it passes on (activations blown up by orders of magnitude, non-finite values) would
poison every microbatch through it. The residual stream's scale changes little from one stage to the next, so the
watch compares each forward it receives with what this peer itself sent lately (its own forwards are the one
reference no other peer can move, however many of its inputs come from one liar): one that is not finite, or
`FACTOR` times over the median RMS of this peer's own recent forwards, is refused. A refused forward is never
computed with: its attempt is reported broken at its sender, as when a relay dies, so its holder re-queues the
microbatch around it; and each such report counts against the sender (`Broken`: the scheduler takes a peer two
others report for gone).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Callable

import torch

from swarm.events import event
from swarm.net.delivery import Inbound
from swarm.peer.pipeline import Requeue
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)

FACTOR = 100.0
"""A tensor whose RMS is this many times the recent median is refused (honest ones stay within a few times)."""
WINDOW = 64
"""This peer's recent forwards whose RMS makes the reference."""
SAMPLE = 65536
"""Values of a tensor looked at (a strided sample): the watch costs the same whatever the model's size, and a
non-finite value spreads over whole rows of the next layer's output, where the sample finds it."""
WARMUP = 8
"""Own forwards sent before any received one is refused for its scale (non-finite ones are from the first)."""


class ActivationWatch:
    """The watch of one peer over the pipeline messages it receives.

    :param requeue: hands this peer's executor each attempt refused here, as a `Requeue` naming the sender (it
      re-queues its own microbatches, and ignores others')
    :param report: reports it broken to the run (the microbatch's holder re-queues it; the scheduler counts it
      against the sender)
    """

    def __init__(self, requeue: Callable[[Requeue], None], report: Callable[[Requeue], None]) -> None:
        self._requeue, self._report = requeue, report
        self._own: deque[float] = deque(maxlen=WINDOW)

    def sent(self, header: HopHeader, tensor: torch.Tensor) -> None:
        """This peer sends `tensor` (the Outbox's hook): its own forwards make the reference."""
        if header.direction == Direction.FORWARD and tensor.is_floating_point() and tensor.numel():
            rms = _rms(_sample(tensor))
            if math.isfinite(rms):
                self._own.append(rms)

    def take(self, m: Inbound) -> bool:
        """Whether to compute with `m`; False once its attempt is reported broken at its sender."""
        h = m.header
        if h.direction != Direction.FORWARD:
            return True
        why = self._why_corrupt(m.tensor)
        if why is None:
            return True
        logger.warning("refused the %s of microbatch %d from %s: %s", h.direction.name.lower(), h.microbatch,
                       m.sender, why, extra=event("activation_refused", sender=m.sender, microbatch=h.microbatch,
                                                  why=why))
        broken = Requeue(iteration=h.iteration, epoch=h.epoch, microbatch=h.microbatch, attempt=h.attempt,
                         gone=m.sender, why=f"its {h.direction.name.lower()} from {m.sender} was corrupt: {why}")
        self._requeue(broken)
        self._report(broken)
        return False

    def _why_corrupt(self, tensor: torch.Tensor) -> str | None:
        if not tensor.is_floating_point() or not tensor.numel():
            return None
        sample = _sample(tensor)
        if not torch.isfinite(sample).all():
            return "non-finite values"
        if len(self._own) >= WARMUP:
            rms, reference = _rms(sample), statistics.median(self._own)
            if reference > 0 and rms > FACTOR * reference:
                return f"RMS {rms:.3g}, over {FACTOR:g}x the {reference:.3g} of this peer's own forwards"
        return None


def _sample(tensor: torch.Tensor) -> torch.Tensor:
    """A strided sample of at most SAMPLE values, as float32."""
    flat = tensor.reshape(-1)
    return flat[:: max(1, flat.numel() // SAMPLE)].float()


def _rms(sample: torch.Tensor) -> float:
    return float(sample.pow(2).mean().sqrt())
