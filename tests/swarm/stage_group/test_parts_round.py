"""Stage averaging by parts, driven directly: six members of one stage, each in its own thread, exchange their
messages through in-memory mailboxes standing in for the transport (which its own tests cover). Every member installs
the visit-weighted mean, bit-identical across the group, sending 4 (n - 1) / n of its gradient; an owner that lies
about its part, a member that goes silent and a hostile piece cost a fallback or a refusal, not the mean."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from peers.averaging import visit_weighted_mean
from peers.worker import StageWorker
from swarm.lateness import LATE_FLOOR
from swarm.net.delivery import Inbound
from swarm.stage_group.allgather import GroupRound
from swarm.stage_group.parts_round import average_by_parts, owners, part_bounds
from swarm.wire import AverageStep, HopHeader
from tests.utils.queues import receive_from
from tests.utils.stage_workers import trained

pytestmark = pytest.mark.timeout(90)

GROUP = [f"peer-{c}" for c in "abcdef"]
Tamper = Callable[[str, HopHeader, torch.Tensor], tuple[HopHeader, torch.Tensor] | None]


def group_of(size: int) -> dict[str, StageWorker]:
    return {p: trained(p, 1 + i % 3, seed=i) for i, p in enumerate(GROUP[:size])}


class Mailboxes:
    """One inbox per member; `send` delivers at once, after `tamper` (which may change or drop a message), and
    counts what each member sent by averaging step and element."""

    def __init__(self, members: list[str], tamper: Tamper | None = None) -> None:
        self.boxes = {p: queue.Queue() for p in members}
        self.tamper = tamper
        self.steps: Counter[tuple[str, AverageStep]] = Counter()
        self.elements: Counter[str] = Counter()

    def send_from(self, sender: str):
        def send(peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
            message = (header, tensor) if self.tamper is None else self.tamper(sender, header, tensor)
            if message is not None:
                self.steps[(sender, message[0].average_step)] += 1
                self.elements[sender] += message[1].numel()
                self.boxes[peer].put(Inbound(sender, message[0], message[1].clone()))
        return send

    def receive_for(self, peer: str):
        return receive_from(self.boxes[peer])


def run_group(workers: dict[str, StageWorker], boxes: Mailboxes, *, alive=lambda p: True, deadline: float = 10.0,
              wire_dtype: str = "float32", faulty=None, late=None, left_out: tuple[str, ...] = ()
              ) -> dict[str, GroupRound]:
    """Every member of `workers` averages by parts in its own thread, over the group `GROUP[:len(workers)]` plus
    any member named by `boxes` only (one that never runs)."""
    results: dict[str, GroupRound] = {}
    group = sorted(boxes.boxes)
    scheduled = {p: w.visits for p, w in workers.items()} | {p: 1 for p in group if p not in workers}

    def member(peer: str) -> None:
        results[peer] = average_by_parts(me=peer, worker=workers[peer], group=group, run_id="r", iteration=4,
                                         epoch=2, send=boxes.send_from(peer), receive=boxes.receive_for(peer),
                                         deadline=deadline, scheduled=scheduled, alive=alive,
                                         faulty=faulty, wire_dtype=wire_dtype, late=late, left_out=left_out)

    threads = [threading.Thread(target=member, args=(p,)) for p in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert set(results) == set(workers), "a member's round did not end"
    return results


def installed(worker: StageWorker) -> dict[str, torch.Tensor]:
    return {n: q.grad for n, q in worker.module.named_parameters()}


def assert_identical_means(workers: dict[str, StageWorker], expected: dict[str, torch.Tensor],
                           rtol: float = 1e-5) -> None:
    first = installed(next(iter(workers.values())))
    for w in workers.values():
        for name, mean in expected.items():
            assert torch.equal(installed(w)[name], first[name]), f"{w.peer_id} installed another {name}"
            torch.testing.assert_close(installed(w)[name], mean, rtol=rtol, atol=1e-6)


def honest_mean(workers: dict[str, StageWorker]) -> dict[str, torch.Tensor]:
    order = sorted(workers)
    return visit_weighted_mean([workers[p].gradient_sums() for p in order], [workers[p].visits for p in order])[0]


def test_parts_and_their_owners_cover_the_gradient():
    assert part_bounds(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    members = GROUP[:5]
    assert [owners(members, k) for k in (0, 4)] == [("peer-a", "peer-b"), ("peer-e", "peer-a")]
    assert all(sum(p in owners(members, k) for k in range(5)) == 2 for p in members)


def test_every_member_installs_the_same_mean_sending_a_fraction_of_the_all_gathers_bytes():
    workers = group_of(6)
    expected = honest_mean(workers)
    boxes = Mailboxes(GROUP)
    results = run_group(workers, boxes)
    assert_identical_means(workers, expected)
    total = sum(w.visits for w in workers.values())
    assert {(r.visits, r.heard) for r in results.values()} == {(total, 6)}
    assert len({tuple(sorted(r.contributors.items())) for r in results.values()}) == 1  # one lineage to chain
    assert all(set(r.lineages) == set(GROUP) for r in results.values())
    numel = sum(p.numel() for p in workers["peer-a"].module.parameters())
    for p in GROUP:  # 2 pieces to each other member... 4 (n - 1) / n of a gradient, and a ballot of n flags
        assert boxes.steps[(p, AverageStep.FALLBACK)] == boxes.steps[(p, AverageStep.WHOLE)] == 0
        assert boxes.elements[p] <= 4 * 5 / 6 * numel + 2 * 6 + 5 * 6
    assert max(boxes.elements.values()) < 5 * numel * 0.7  # the all-gather sends 5 gradients


def test_bfloat16_parts_keep_the_members_identical():
    workers = group_of(6)
    rounded = [{n: g.bfloat16().float() for n, g in workers[p].gradient_sums().items()} for p in sorted(workers)]
    expected = visit_weighted_mean(rounded, [workers[p].visits for p in sorted(workers)])[0]
    run_group(workers, Mailboxes(GROUP), wire_dtype="bfloat16")
    assert_identical_means(workers, expected, rtol=2 ** -8)  # the parts' means travel in bfloat16 too


def test_an_owner_lying_about_its_parts_is_outvoted_by_the_fallback():
    workers = group_of(6)
    expected = honest_mean(workers)

    def liar(sender: str, header: HopHeader, tensor: torch.Tensor):
        if sender == "peer-c" and header.average_step == AverageStep.PART_MEAN:
            return header, tensor * 3
        return header, tensor

    boxes = Mailboxes(GROUP, liar)
    run_group(workers, boxes)
    assert_identical_means(workers, expected)
    # peer-c owns parts 1 and 2: both went to the fallback, nothing else
    assert all(boxes.steps[(p, AverageStep.FALLBACK)] == 2 * 5 for p in GROUP)


def test_a_silent_member_costs_its_parts_a_fallback_and_is_left_out():
    workers = group_of(6)
    del workers["peer-f"]
    expected = honest_mean(workers)
    gone = threading.Event()
    threading.Timer(0.5, gone.set).start()
    results = run_group(workers, Mailboxes(GROUP), alive=lambda p: not (p == "peer-f" and gone.is_set()))
    assert_identical_means(workers, expected)
    assert {r.heard for r in results.values()} == {5}


def test_a_member_left_out_of_the_commit_steps_alone_at_once_and_the_others_average_by_parts_without_it():
    """A holder the commit left out for being late takes no part in a round by parts (the all-gather sends it the
    others' gradients instead): it installs its own gradient without waiting, its lineage then differs and it is
    mended; the others' round is the round of the group without it."""
    workers = group_of(6)
    own = workers["peer-f"].gradient_sums()
    expected = honest_mean({p: w for p, w in workers.items() if p != "peer-f"})
    boxes = Mailboxes(GROUP)
    began = time.monotonic()
    results = run_group(workers, boxes, left_out=("peer-f",), deadline=20.0)
    assert time.monotonic() - began < 10.0
    assert_identical_means({p: w for p, w in workers.items() if p != "peer-f"}, expected)
    assert {p: r.heard for p, r in results.items()} == {**dict.fromkeys(GROUP[:5], 5), "peer-f": 1}
    assert not any(sender == "peer-f" for sender, _ in boxes.steps)
    for name, grad in installed(workers["peer-f"]).items():
        torch.testing.assert_close(grad, own[name] / workers["peer-f"].visits)


def test_a_frozen_member_is_reported_late_against_the_others_once_probed_it_is_not_waited_for():
    workers = group_of(6)
    del workers["peer-f"]
    expected = honest_mean(workers)
    told: list[str] = []
    began = time.monotonic()
    run_group(workers, Mailboxes(GROUP), deadline=30.0, alive=lambda p: p not in told,
              late=lambda peer, seconds: told.append(peer))
    assert time.monotonic() - began < 3 * LATE_FLOOR + 5.0  # not the 30-s deadline of each step
    assert set(told) == {"peer-f"}
    assert_identical_means(workers, expected)


def test_a_hostile_piece_is_refused_as_proof_and_the_rest_averaged():
    workers = group_of(6)
    expected = honest_mean({p: w for p, w in workers.items() if p != "peer-e"})
    accused: list[tuple[str, str]] = []

    def hostile(sender: str, header: HopHeader, tensor: torch.Tensor):
        if sender == "peer-e" and header.average_step in (AverageStep.PIECE, AverageStep.FALLBACK):
            return header, torch.full_like(tensor, float("nan"))
        return header, tensor

    run_group(workers, Mailboxes(GROUP, hostile), faulty=lambda suspect, why: accused.append((suspect, why)))
    honest = {p: w for p, w in workers.items() if p != "peer-e"}
    assert_identical_means(honest, expected)
    assert accused and {s for s, _ in accused} == {"peer-e"}


def test_a_group_under_five_all_gathers():
    workers = group_of(4)
    expected, boxes = honest_mean(workers), Mailboxes(GROUP[:4])
    run_group(workers, boxes)
    assert_identical_means(workers, expected)
    assert all(boxes.steps[(p, AverageStep.WHOLE)] == 3 for p in workers)
