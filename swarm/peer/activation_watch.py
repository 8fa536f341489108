"""`ActivationWatch`: a forward whose activations are corrupt breaks its microbatch's attempt at its sender.

A relay that corrupts what it passes on with non-finite values (a fault, or a peer whose stage diverged) would
poison every microbatch through it, and every stage's gradient behind it. The watch looks at a strided sample of
each forward it receives and refuses one that is not finite, before it is computed with: its attempt is reported
broken at its sender, as when a relay dies, so its holder re-queues the microbatch around it; and each such report
counts against the sender (`Broken`: the scheduler takes a peer two others report for gone).

It does not judge the scale of finite activations: the residual stream's scale differs from stage to stage (the
embedding's output is ~50x smaller than the last block's here), so no one reference fits every sender, and a
wrong one evicts honest relays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from swarm.events import event
from swarm.net.delivery import Inbound
from swarm.peer.attempts import Requeue
from swarm.wire import Direction

logger = logging.getLogger(__name__)

SAMPLE = 65536
"""Values of a tensor looked at (a strided sample): the watch costs the same whatever the model's size, and a
non-finite value spreads over whole rows of the next layer's output, where the sample finds it."""


class ActivationWatch:
    """The watch of one peer over the forwards it receives.

    :param requeue: hands this peer's executor each attempt refused here, as a `Requeue` naming the sender (it
      re-queues its own microbatches, and ignores others')
    :param report: reports it broken to the run (the microbatch's holder re-queues it; the scheduler counts it
      against the sender)
    """

    def __init__(self, requeue: Callable[[Requeue], None], report: Callable[[Requeue], None]) -> None:
        self._requeue, self._report = requeue, report

    def take(self, m: Inbound) -> bool:
        """Whether to compute with `m`; False once its attempt is reported broken at its sender."""
        h = m.header
        if h.direction != Direction.FORWARD or finite(m.tensor):
            return True
        why = "non-finite values"
        logger.warning("refused the forward of microbatch %d from %s: %s", h.microbatch, m.sender, why,
                       extra=event("activation_refused", sender=m.sender, microbatch=h.microbatch, why=why))
        broken = Requeue(iteration=h.iteration, epoch=h.epoch, microbatch=h.microbatch, attempt=h.attempt,
                         gone=m.sender, why=f"its forward from {m.sender} was corrupt: {why}")
        self._requeue(broken)
        self._report(broken)
        return False


def finite(tensor: torch.Tensor) -> bool:
    """Whether a strided sample of at most SAMPLE values of `tensor` is finite (integer tensors always are)."""
    if not tensor.is_floating_point() or not tensor.numel():
        return True
    flat = tensor.reshape(-1)
    return bool(torch.isfinite(flat[:: max(1, flat.numel() // SAMPLE)]).all())
