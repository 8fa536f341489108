"""A corrupt forward is refused before it is computed with, and its attempt reported broken at its sender; the
reference is this peer's own forwards, which no sender can move."""

from __future__ import annotations

import torch

from swarm.net.delivery import Inbound
from swarm.peer.activation_watch import WARMUP, ActivationWatch
from swarm.wire import Direction, HopHeader


def header(sender: str, direction=Direction.FORWARD, microbatch: int = 0) -> HopHeader:
    return HopHeader(run="r", iteration=4, microbatch=microbatch, route=("QmHolder", sender, "QmMe"), hop=2,
                     direction=direction, epoch=1, dtype="float32", shape=(4, 16, 32), attempt=0)


def test_blown_up_or_non_finite_forwards_break_their_attempt_at_the_sender():
    requeued, reported = [], []
    watch = ActivationWatch(requeued.append, reported.append)
    torch.manual_seed(0)
    for _ in range(WARMUP - 1):
        watch.sent(header("QmMe"), torch.randn(4, 16, 32))
    # before this peer has sent enough of its own, only non-finite values are refused: every input came from a liar
    assert watch.take(Inbound("QmRelay", header("QmRelay"), torch.randn(4, 16, 32) * 1e4))
    watch.sent(header("QmMe"), torch.randn(4, 16, 32))
    for i in range(12):  # honest inputs of varying scale, and a spike well within bounds
        assert watch.take(Inbound("QmHonest", header("QmHonest"), torch.randn(4, 16, 32) * (1 + 0.5 * (i % 4))))
    assert watch.take(Inbound("QmHonest", header("QmHonest"), torch.randn(4, 16, 32) * 20))
    for _ in range(20):  # however many blown-up inputs arrive, the reference stays this peer's own
        assert not watch.take(Inbound("QmRelay", header("QmRelay", microbatch=7), torch.randn(4, 16, 32) * 1e4))
    bad = torch.randn(4, 16, 32)
    bad[1] = float("nan")
    assert not watch.take(Inbound("QmRelay", header("QmRelay", microbatch=8), bad))
    assert {r.microbatch for r in requeued} == {7, 8} and requeued == reported
    assert all(r.gone == "QmRelay" and r.iteration == 4 and r.epoch == 1 and r.attempt == 0 for r in requeued)
    assert "RMS" in requeued[0].why and "non-finite" in requeued[-1].why
    # backwards, averaging and state are not the watch's to judge
    for direction in (Direction.BACKWARD, Direction.AVERAGE):
        assert watch.take(Inbound("QmMate", header("QmMate", direction), torch.full((10,), float("inf"))))
