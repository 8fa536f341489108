"""Hostile stage averaging (issue #17), through the real entry point: three members of stage 1, each in its own
thread, exchange real AVERAGE messages (`Inbound`) through in-memory mailboxes; peer-c computes honestly and then
sends, in turn, -1e6 x its gradient sum, a sum with one finite 3e38 value, or its sum claiming 2^40 visits. Before
issue #17 the plain weighted mean made the honest members climb the loss, skip their step, or install the honest
mean x 9e-13. Now they install (close to) the honest mean, bit-identical to each other, and say why.

Two situations: a group's first iteration (no history yet: CenteredClip bounds what peer-c does), and a group that
has stepped before (peer-c's gradient is far outside the stage's history: refused, the rest averaged exactly).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import replace

import pytest
import torch

from peers.averaging import mean_by_visits
from peers.flat_tensors import flatten
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker
from swarm.events import EVENT_ATTR
from swarm.net.delivery import Inbound
from swarm.stage_group.allgather import average_stage_group
from swarm.wire import HopHeader

pytestmark = pytest.mark.timeout(60)

MICRO = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
SPLIT = (2, 1, 1)
GROUP = ["peer-a", "peer-b", "peer-c"]
SCHEDULED = dict.fromkeys(GROUP, 2)


def _scaled(h: HopHeader, t: torch.Tensor) -> tuple[HopHeader, torch.Tensor]:
    return h, t * -1e6


def _huge(h: HopHeader, t: torch.Tensor) -> tuple[HopHeader, torch.Tensor]:
    t = t.clone()
    t[0] = 3e38
    return h, t


def _inflated(h: HopHeader, t: torch.Tensor) -> tuple[HopHeader, torch.Tensor]:
    return replace(h, weight=2 ** 40), t


def member(peer: str, primed: bool) -> StageWorker:
    """A stage-1 worker with 2 visits: a microbatch every member saw, and one of its own (smaller). `primed`: after
    one identical step before, so the group has a history."""
    w = StageWorker(peer, 1, MICRO, SPLIT, OptimConfig(grad_clip=0), seed=0)
    if primed:
        _backward(w, 0, seed=99, scale=1.0)
        w.set_mean_gradients(w.gradient_sums(), 1)
        w.step()
    _backward(w, 1, seed=7, scale=1.0)
    _backward(w, 2, seed=100 + GROUP.index(peer), scale=0.3)
    return w


def _backward(w: StageWorker, mb: int, seed: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    out = w.forward(mb, torch.randn(2, 8, MICRO.dim, generator=gen))
    w.backward(mb, torch.randn(out.shape, generator=gen) * scale)


class Mailboxes:
    """One inbox per member; what peer-c sends goes through `tamper` first."""

    def __init__(self, tamper) -> None:
        self.boxes = {p: queue.Queue() for p in GROUP}
        self.tamper = tamper

    def send_from(self, sender: str):
        def send(peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
            if sender == "peer-c":
                header, tensor = self.tamper(header, tensor)
            self.boxes[peer].put(Inbound(sender, header, tensor.clone()))
        return send

    def receive_for(self, peer: str):
        def receive(timeout: float) -> list[Inbound]:
            try:
                out = [self.boxes[peer].get(timeout=timeout)]
            except queue.Empty:
                return []
            while not self.boxes[peer].empty():
                out.append(self.boxes[peer].get_nowait())
            return out
        return receive


def average(workers: dict[str, StageWorker], tamper) -> dict[str, tuple[int, int]]:
    boxes, results = Mailboxes(tamper), {}

    def run(peer: str) -> None:
        r = average_stage_group(me=peer, worker=workers[peer], group=sorted(workers), run_id="r", iteration=4,
                                epoch=2, send=boxes.send_from(peer), receive=boxes.receive_for(peer), deadline=10.0,
                                scheduled=SCHEDULED)
        results[peer] = (r.visits, r.heard)

    threads = [threading.Thread(target=run, args=(p,)) for p in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def installed(w: StageWorker) -> torch.Tensor:
    return flatten({n: p.grad for n, p in w.module.named_parameters()})


def refusals(caplog) -> list[dict]:
    return [getattr(r, EVENT_ATTR) for r in caplog.records if getattr(r, EVENT_ATTR, {}).get("event")
            == "gradient_refused"]


@pytest.mark.parametrize("primed", [False, True], ids=["first iteration", "with history"])
@pytest.mark.parametrize("tamper", [_scaled, _huge], ids=["scaled -1e6x", "huge 3e38"])
def test_a_scaled_or_huge_gradient_leaves_the_honest_members_on_the_honest_mean(tamper, primed, caplog):
    workers = {p: member(p, primed) for p in GROUP}
    sums = {p: flatten(workers[p].gradient_sums()) for p in ("peer-a", "peer-b")}
    honest, visits = mean_by_visits(list(sums.values()), [2, 2])
    with caplog.at_level(logging.WARNING):
        results = average(workers, tamper)
    a, b = installed(workers["peer-a"]), installed(workers["peer-b"])
    assert torch.equal(a, b)  # the group still agrees bit for bit
    if primed:  # far outside the history: refused, and the others' mean is exact
        assert results["peer-a"] == (visits, 3)
        assert torch.equal(a, honest)
        assert any(e["sender"] == "peer-c" and e["why"].startswith("refused: mean gradient norm")
                   for e in refusals(caplog))
    else:  # no history yet: CenteredClip bounds peer-c's pull by its weight over the others' (1/2) x tau (twice the
        # honest members' distance): the honest spread, not peer-c's 1e6
        spread = float((sums["peer-a"] - sums["peer-b"]).norm()) / 2
        assert torch.isfinite(a).all()
        assert float((a - honest).norm()) <= spread * 1.01
        assert torch.nn.functional.cosine_similarity(a, honest, dim=0) > 0.9
        assert any(e["sender"] == "peer-c" and "CenteredClip" in e["why"] for e in refusals(caplog))
    assert not workers["peer-a"].step().skipped


def test_an_inflated_weight_counts_as_the_visits_the_schedule_gave():
    workers = {p: member(p, primed=False) for p in GROUP}
    honest, total = mean_by_visits([flatten(workers[p].gradient_sums()) for p in GROUP], [2, 2, 2])
    results = average(workers, _inflated)
    assert results["peer-a"] == results["peer-b"] == (total, 3)
    a = installed(workers["peer-a"])
    assert torch.equal(a, installed(workers["peer-b"]))
    torch.testing.assert_close(a, honest)


def test_in_a_group_of_two_a_gradient_far_outside_the_history_is_refused():
    workers = {p: member(p, primed=True) for p in ("peer-a", "peer-c")}
    own, visits = mean_by_visits([flatten(workers["peer-a"].gradient_sums())], [2])
    results = average(workers, _scaled)
    assert results["peer-a"] == (visits, 2)
    assert torch.equal(installed(workers["peer-a"]), own)
