"""A forward with non-finite values is refused before it is computed with, and its attempt reported broken at its
sender; finite forwards of any scale pass (stages differ in scale, so scale is no proof)."""

from __future__ import annotations

import torch

from swarm.net.delivery import Inbound
from swarm.peer.activation_watch import SAMPLE, ActivationWatch
from swarm.wire import Direction, HopHeader


def header(sender: str, direction=Direction.FORWARD, microbatch: int = 0) -> HopHeader:
    return HopHeader(run="r", iteration=4, microbatch=microbatch, route=("QmHolder", sender, "QmMe"), hop=2,
                     direction=direction, epoch=1, dtype="float32", shape=(4, 16, 32), attempt=0)


def test_non_finite_forwards_break_their_attempt_at_the_sender():
    requeued, reported = [], []
    watch = ActivationWatch(requeued.append, reported.append)
    for scale in (1e-3, 1.0, 1e3):  # an embedding's output, a block's, a large one: all honest
        assert watch.take(Inbound("QmHonest", header("QmHonest"), torch.randn(4, 16, 32) * scale))
    bad = torch.randn(4, 16, 32)
    bad[1] = float("nan")
    assert not watch.take(Inbound("QmRelay", header("QmRelay", microbatch=7), bad))
    big = torch.randn(4 * SAMPLE)  # only a strided sample is looked at; non-finite values spread over rows
    big[::5] = float("inf")
    assert not watch.take(Inbound("QmRelay", header("QmRelay", microbatch=8), big))
    assert [r.microbatch for r in requeued] == [7, 8] and requeued == reported
    assert all(r.gone == "QmRelay" and r.iteration == 4 and r.epoch == 1 and r.attempt == 0 for r in requeued)
    assert all("non-finite" in r.why for r in requeued)
    # backwards and averaging are judged elsewhere (the averaging refuses non-finite gradients itself)
    for direction in (Direction.BACKWARD, Direction.AVERAGE):
        assert watch.take(Inbound("QmMate", header("QmMate", direction), torch.full((10,), float("inf"))))
