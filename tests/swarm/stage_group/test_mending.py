"""A stage group whose copies went apart finds it from their lineages and mends it: three members, each in its own
thread, average through in-memory mailboxes standing in for the transport (which its own tests cover). A member
whose gradients reach one stage mate and not the other (as when it dies mid-round) splits the group; the next
round's lineages name the stray, and the stray takes the holders' state, bit for bit."""

from __future__ import annotations

import queue
import threading

import pytest
import torch

from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker
from swarm.net.delivery import Inbound
from swarm.stage_group.allgather import GroupRound, average_stage_group
from swarm.stage_group.lineage import Verdict, chain, judge
from swarm.stage_group.mending import mend
from swarm.stage_group.state_transfer import state_digest, state_parts
from swarm.wire import Direction, HopHeader

pytestmark = pytest.mark.timeout(60)

MICRO = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
SPLIT = (2, 1, 1)
GROUP = ("peer-a", "peer-b", "peer-c")


class Mailboxes:
    """One inbox per member and kind of message (averaging, stage state); `cut` drops what one member sends
    another."""

    def __init__(self) -> None:
        self.boxes = {(p, d): queue.Queue() for p in GROUP for d in (Direction.AVERAGE, Direction.STATE)}
        self.cut: set[tuple[str, str]] = set()

    def send_from(self, sender: str):
        def send(peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
            if (sender, peer) not in self.cut:
                self.boxes[(peer, header.direction)].put(Inbound(sender, header, tensor.clone()))
        return send

    def receive_for(self, peer: str, direction: Direction):
        def receive(timeout: float) -> list[Inbound]:
            try:
                out = [self.boxes[(peer, direction)].get(timeout=timeout)]
            except queue.Empty:
                return []
            while not self.boxes[(peer, direction)].empty():
                out.append(self.boxes[(peer, direction)].get_nowait())
            return out
        return receive


def train(workers: dict[str, StageWorker], iteration: int) -> None:
    """Each member runs its own random microbatch forward and backward."""
    for i, (_, w) in enumerate(sorted(workers.items())):
        gen = torch.Generator().manual_seed(100 * iteration + i)
        out = w.forward(iteration, torch.randn(2, 8, MICRO.dim, generator=gen))
        w.backward(iteration, torch.randn(out.shape, generator=gen))


def in_threads(work, peers) -> dict:
    results = {}
    threads = [threading.Thread(target=lambda p=p: results.__setitem__(p, work(p))) for p in peers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def round_of(workers, boxes, lineages, iteration) -> dict[str, GroupRound]:
    """One averaging round of every member, each sending its lineage; every member steps."""
    def member(peer: str) -> GroupRound:
        r = average_stage_group(me=peer, worker=workers[peer], group=list(GROUP), run_id="r", iteration=iteration,
                                epoch=0, send=boxes.send_from(peer), deadline=1.0,
                                receive=boxes.receive_for(peer, Direction.AVERAGE), scheduled=dict.fromkeys(GROUP, 1),
                                lineage=lineages[peer])
        workers[peer].step()
        return r
    train(workers, iteration)
    return in_threads(member, GROUP)


def state_of(w: StageWorker) -> bytes:
    return state_digest(*state_parts(w), w.steps)


def test_a_member_that_reached_one_stage_mate_only_is_found_by_lineage_and_the_stray_takes_the_holders_state():
    workers = {p: StageWorker(p, 1, MICRO, SPLIT, OptimConfig(grad_clip=0), seed=0) for p in GROUP}
    boxes, lineages = Mailboxes(), dict.fromkeys(GROUP, b"")
    boxes.cut = {("peer-c", "peer-b")}  # peer-c's gradients never reach peer-b: it averages without them
    first = round_of(workers, boxes, lineages, iteration=4)
    assert {p: r.heard for p, r in first.items()} == {"peer-a": 3, "peer-b": 2, "peer-c": 3}
    assert state_of(workers["peer-a"]) == state_of(workers["peer-c"]) != state_of(workers["peer-b"])
    lineages = {p: chain(b"", judge(r.lineages), None, 4, r.contributors) for p, r in first.items()}
    assert lineages["peer-a"] == lineages["peer-c"] != lineages["peer-b"]

    boxes.cut = set()  # the next round is whole: its lineages show the split
    second = round_of(workers, boxes, lineages, iteration=5)
    verdicts = {p: judge(r.lineages) for p, r in second.items()}
    assert set(verdicts.values()) == {Verdict(lineages["peer-a"], ("peer-a", "peer-c"), ("peer-b",))}
    mended = in_threads(lambda p: mend(me=p, worker=workers[p], verdict=verdicts[p], run_id="r", iteration=5,
                                       epoch=0, send=boxes.send_from(p),
                                       receive=boxes.receive_for(p, Direction.STATE), timeout=10.0), GROUP)
    assert mended == {"peer-a": None, "peer-b": True, "peer-c": None}
    assert state_of(workers["peer-a"]) == state_of(workers["peer-b"]) == state_of(workers["peer-c"])
    after = {p: chain(lineages[p], verdicts[p], mended[p], 5, second[p].contributors) for p in GROUP}
    assert len(set(after.values())) == 1

    third = round_of(workers, boxes, after, iteration=6)  # whole again, and no stray left
    assert {judge(r.lineages).strays for r in third.values()} == {()}
    assert state_of(workers["peer-a"]) == state_of(workers["peer-b"]) == state_of(workers["peer-c"])


def test_a_stray_whose_holders_state_does_not_come_keeps_its_own_and_its_lineage_apart():
    workers = {p: StageWorker(p, 1, MICRO, SPLIT, OptimConfig(grad_clip=0), seed=0) for p in GROUP}
    boxes = Mailboxes()
    boxes.cut = {("peer-a", "peer-b"), ("peer-c", "peer-b")}
    verdict = Verdict(b"L", ("peer-a", "peer-c"), ("peer-b",))
    before = state_of(workers["peer-b"])
    assert mend(me="peer-b", worker=workers["peer-b"], verdict=verdict, run_id="r", iteration=5, epoch=0,
                send=boxes.send_from("peer-b"), receive=boxes.receive_for("peer-b", Direction.STATE),
                timeout=0.5) is False
    assert state_of(workers["peer-b"]) == before
    assert chain(b"M", verdict, False, 5, {"peer-a": 1}) != chain(b"L", verdict, None, 5, {"peer-a": 1})
