"""The default stage averaging (all-gather over the transport's messages), driven directly: three members of one
stage, each in its own thread, exchange their gradient sums through in-memory mailboxes standing in for the
transport (which its own tests cover). Every member installs the visit-weighted mean, bit-identical across the
group; a member that never sends is left out once it is no longer worth waiting for; a member the commit left out
takes the others' mean without giving its own; hostile contributions are dropped."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace

import pytest
import torch

from peers.averaging import visit_weighted_mean
from peers.worker import StageWorker
from swarm.lateness import LATE_FLOOR
from swarm.net.delivery import Inbound
from swarm.stage_group.allgather import average_stage_group
from swarm.wire import HopHeader
from tests.utils.queues import receive_from
from tests.utils.stage_workers import trained

pytestmark = pytest.mark.timeout(60)

GROUP = ["peer-a", "peer-b", "peer-c"]


class Mailboxes:
    """One inbox per member; `send` delivers at once (or drops, for a member that is `silent`)."""

    def __init__(self, silent: frozenset[str] = frozenset()) -> None:
        self.boxes = {p: queue.Queue() for p in GROUP}
        self.silent = silent

    def send_from(self, sender: str):
        def send(peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
            if sender not in self.silent:
                self.boxes[peer].put(Inbound(sender, header, tensor.clone()))
        return send

    def receive_for(self, peer: str):
        return receive_from(self.boxes[peer])


def run_group(workers: dict[str, StageWorker], boxes: Mailboxes, *, alive=lambda p: True, deadline: float = 10.0,
              scheduled: dict[str, int] | None = None, wire_dtype: str = "float32",
              late=None, left_out: tuple[str, ...] = (), told: list | None = None) -> dict[str, tuple[int, int]]:
    """Every member of `workers` averages in its own thread; `scheduled` defaults to the visits each made."""
    results: dict[str, tuple[int, int]] = {}
    scheduled = scheduled if scheduled is not None else {p: w.visits for p, w in workers.items()}

    def member(peer: str) -> None:
        r = average_stage_group(me=peer, worker=workers[peer], group=GROUP, run_id="r", iteration=4, epoch=2,
                                send=boxes.send_from(peer), receive=boxes.receive_for(peer), deadline=deadline,
                                scheduled=scheduled, alive=alive, wire_dtype=wire_dtype, late=late,
                                left_out=left_out, tell=None if told is None else telling(peer))
        results[peer] = (r.visits, r.heard)

    def telling(peer: str):
        def tell(to: str, header: HopHeader, tensor: torch.Tensor) -> None:
            told.append((peer, to))
            boxes.send_from(peer)(to, header, tensor)
        return tell

    threads = [threading.Thread(target=member, args=(p,)) for p in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def declared_gone_soon(peer: str, after: float = 0.5):
    """`alive` for a group whose member `peer` the scheduler declares gone `after` seconds in."""
    gone = threading.Event()
    threading.Timer(after, gone.set).start()
    return lambda p: not (p == peer and gone.is_set())


def test_every_member_installs_the_same_visit_weighted_mean():
    visits = {"peer-a": 1, "peer-b": 3, "peer-c": 2}
    workers = {p: trained(p, v, seed=i) for i, (p, v) in enumerate(visits.items())}
    expected, total = visit_weighted_mean([workers[p].gradient_sums() for p in GROUP], [visits[p] for p in GROUP])
    results = run_group(workers, Mailboxes())
    assert results == dict.fromkeys(GROUP, (6, 3))
    for p in GROUP:
        grads = {n: q.grad for n, q in workers[p].module.named_parameters()}
        for name, mean in expected.items():
            torch.testing.assert_close(grads[name], mean, rtol=1e-6, atol=1e-7)
            assert torch.equal(grads[name], {n: q.grad for n, q in workers["peer-a"].module.named_parameters()}[name])


def test_bfloat16_on_the_wire_halves_the_bytes_and_keeps_the_members_identical():
    visits = {"peer-a": 1, "peer-b": 3, "peer-c": 2}
    workers = {p: trained(p, v, seed=i) for i, (p, v) in enumerate(visits.items())}
    rounded = [{n: g.bfloat16().float() for n, g in workers[p].gradient_sums().items()} for p in GROUP]
    expected, _ = visit_weighted_mean(rounded, [visits[p] for p in GROUP])
    exact, _ = visit_weighted_mean([workers[p].gradient_sums() for p in GROUP], [visits[p] for p in GROUP])
    boxes, sent = Mailboxes(), []
    plain = boxes.send_from

    def recording(sender: str):
        def send(peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
            sent.append(tensor.dtype)
            plain(sender)(peer, header, tensor)
        return send

    boxes.send_from = recording
    assert run_group(workers, boxes, wire_dtype="bfloat16") == dict.fromkeys(GROUP, (6, 3))
    assert sent == [torch.bfloat16] * 6
    first = {n: q.grad for n, q in workers["peer-a"].module.named_parameters()}
    for p in GROUP:
        grads = {n: q.grad for n, q in workers[p].module.named_parameters()}
        for name, mean in expected.items():
            assert torch.equal(grads[name], first[name])  # every member combined the same rounded values
            assert grads[name].dtype == torch.float32
            torch.testing.assert_close(grads[name], mean, rtol=1e-6, atol=1e-7)  # the mean of the rounded sums
    assert not all(torch.allclose(first[n], m, rtol=1e-6, atol=1e-7) for n, m in exact.items())  # it did round


def test_a_float32_contribution_to_a_bfloat16_round_is_refused():
    workers = {p: trained(p, v, seed=v) for p, v in (("peer-a", 2), ("peer-b", 1), ("peer-c", 3))}
    boxes = Mailboxes()
    honest = boxes.send_from("peer-c")
    boxes.send_from = lambda sender, own=boxes.send_from: (
        (lambda peer, h, t: honest(peer, h, t.float())) if sender == "peer-c" else own(sender))
    results = run_group(workers, boxes, alive=declared_gone_soon("peer-c"), deadline=5.0, wire_dtype="bfloat16")
    assert results["peer-a"] == (3, 2) and results["peer-b"] == (3, 2)


def test_a_silent_member_is_left_out_once_it_is_not_worth_waiting_for():
    workers = {p: trained(p, v, seed=v) for p, v in (("peer-a", 2), ("peer-b", 1))}
    expected, _ = visit_weighted_mean([workers[p].gradient_sums() for p in ("peer-a", "peer-b")], [2, 1])
    results = run_group(workers, Mailboxes(), alive=declared_gone_soon("peer-c"))
    assert results == dict.fromkeys(["peer-a", "peer-b"], (3, 2))
    grads = dict(workers["peer-a"].module.named_parameters())
    for name, mean in expected.items():
        torch.testing.assert_close(grads[name].grad, mean)


def test_a_member_left_out_of_the_commit_gives_nothing_and_installs_the_others_mean():
    """A holder the commit left out for being late stays in the run: its mates neither wait for its gradients nor
    take them, but send it theirs (by `tell`), and its copy of the stage steps with theirs; one declared gone is sent
    nothing."""
    workers = {p: trained(p, v, seed=v) for p, v in (("peer-a", 2), ("peer-b", 1), ("peer-c", 3))}
    expected, _ = visit_weighted_mean([workers[p].gradient_sums() for p in ("peer-a", "peer-b")], [2, 1])
    boxes, sent = Mailboxes(), []
    plain = boxes.send_from
    boxes.send_from = lambda sender: (lambda peer, h, t: (sent.append((sender, peer)), plain(sender)(peer, h, t)))
    told: list[tuple[str, str]] = []
    assert run_group(workers, boxes, left_out=("peer-c",), told=told) == dict.fromkeys(GROUP, (3, 2))
    assert sorted(sent) == [("peer-a", "peer-b"), ("peer-a", "peer-c"), ("peer-b", "peer-a"), ("peer-b", "peer-c")]
    assert sorted(told) == [("peer-a", "peer-c"), ("peer-b", "peer-c")]  # a courtesy copy: its failure is not news
    for p in GROUP:
        for name, q in workers[p].module.named_parameters():
            torch.testing.assert_close(q.grad, expected[name])
            assert torch.equal(q.grad, dict(workers["peer-a"].module.named_parameters())[name].grad)
    sent.clear()
    workers = {p: trained(p, v, seed=v) for p, v in (("peer-a", 2), ("peer-b", 1))}
    assert run_group(workers, boxes, left_out=("peer-c",), alive=lambda p: p != "peer-c") == \
        dict.fromkeys(["peer-a", "peer-b"], (3, 2))
    assert sorted(sent) == [("peer-a", "peer-b"), ("peer-b", "peer-a")]


def test_a_frozen_member_is_reported_late_against_its_mates_and_not_waited_for_once_probed():
    """peer-c sends nothing and is never declared gone: once the others came, it is late against them; the caller's
    probe (here: at once unanswered) makes it not worth waiting for, long before the round's deadline."""
    workers = {p: trained(p, v, seed=v) for p, v in (("peer-a", 2), ("peer-b", 1))}
    told: list[tuple[str, str, float]] = []
    probed_dead: dict[str, set[str]] = {p: set() for p in workers}  # each member's own probe

    def late_for(member: str):
        def late(peer: str, seconds: float) -> None:
            told.append((member, peer, seconds))
            probed_dead[member].add(peer)
        return late

    results: dict[str, tuple[int, int]] = {}
    boxes = Mailboxes()

    def member(peer: str) -> None:
        r = average_stage_group(me=peer, worker=workers[peer], group=GROUP, run_id="r", iteration=4, epoch=2,
                                send=boxes.send_from(peer), receive=boxes.receive_for(peer), deadline=30.0,
                                scheduled={"peer-a": 2, "peer-b": 1, "peer-c": 1},
                                alive=lambda p, me=peer: p not in probed_dead[me], late=late_for(peer))
        results[peer] = (r.visits, r.heard)

    began = time.monotonic()
    threads = [threading.Thread(target=member, args=(p,)) for p in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == dict.fromkeys(workers, (3, 2))
    assert time.monotonic() - began < LATE_FLOOR + 5.0  # not the 30-s deadline
    assert sorted((m, p) for m, p, _ in told) == [("peer-a", "peer-c"), ("peer-b", "peer-c")]  # once each
    assert all(seconds > LATE_FLOOR for _, _, seconds in told)


@pytest.mark.parametrize("tamper, why", [
    (lambda h, t: (h, t[:-1]), "shape"),
    (lambda h, t: (h, torch.full_like(t, float("inf"))), "non-finite"),
    (lambda h, t: (replace(h, stages=(2, 2)), t), "another stage"),
    (lambda h, t: (replace(h, epoch=1), t), "an older epoch"),
])
def test_a_hostile_contribution_is_dropped_and_the_honest_mean_installed(tamper, why):
    workers = {p: trained(p, v, seed=v) for p, v in (("peer-a", 2), ("peer-b", 1), ("peer-c", 3))}
    boxes = Mailboxes()
    honest = boxes.send_from("peer-c")

    def hostile(peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
        honest(peer, *tamper(header, tensor))

    boxes.send_from = lambda sender, own=boxes.send_from: hostile if sender == "peer-c" else own(sender)
    expected, _ = visit_weighted_mean([workers[p].gradient_sums() for p in ("peer-a", "peer-b")], [2, 1])
    results = run_group(workers, boxes, alive=declared_gone_soon("peer-c"), deadline=5.0)
    assert results["peer-a"] == (3, 2) and results["peer-b"] == (3, 2), why
    grads = dict(workers["peer-b"].module.named_parameters())
    for name, mean in expected.items():
        torch.testing.assert_close(grads[name].grad, mean)
