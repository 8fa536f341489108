"""The queue picks the next operation as the simulator's `backward_first` rule does."""

from __future__ import annotations

import time

import pytest
import torch

from scheduler.schedule import Route
from swarm.net.delivery import Inbound
from swarm.peer.operation_queue import IDLE_WAIT, OperationQueue
from swarm.wire import Direction, HopHeader

pytestmark = pytest.mark.timeout(30)


def message(mb: int, direction: Direction, hop: int = 1) -> Inbound:
    header = HopHeader(run="q", iteration=0, microbatch=mb, route=("h0", "r1"), hop=hop, direction=direction, epoch=0,
                       dtype="", shape=(), stages=(0, 1))
    return Inbound("h0", header, torch.zeros(1))


def never(m: Inbound) -> bool:
    return False


def test_backwards_and_losses_go_before_forwards_that_arrived_earlier():
    q = OperationQueue([])
    fwd, bwd = message(0, Direction.FORWARD), message(1, Direction.BACKWARD)
    loss = message(2, Direction.FORWARD, hop=0)  # a forward back at its holder: its loss
    for m in (fwd, bwd, loss):
        q.add(m)
    assert q.forwards_waiting() == 1
    assert [q.next(True, never) for _ in range(4)] == [bwd, loss, fwd, None]


def test_without_a_free_slot_only_backwards_and_superseding_forwards_run():
    q = OperationQueue([Route(microbatch=9, origin="h0", stages=(1,), peers=("r1",))])
    fwd, newer = message(0, Direction.FORWARD), message(1, Direction.FORWARD)
    q.add(fwd)
    q.add(newer)
    assert q.next(False, never) is None  # the due injection waits for a slot too
    assert q.next(False, lambda m: m is newer) is newer
    assert q.idle_wait(False) == IDLE_WAIT


def test_an_injection_runs_when_due_and_before_a_forward_that_arrived_later():
    first = Route(microbatch=0, origin="h0", stages=(1,), peers=("r1",))
    late = Route(microbatch=1, origin="h0", stages=(1,), peers=("r1",), inject_after=0.3)
    q = OperationQueue([first, late])
    fwd = message(5, Direction.FORWARD)
    q.add(fwd)
    assert q.next(True, never) == first  # due at the start, before the forward arrived
    assert q.next(True, never) is fwd
    assert q.next(True, never) is None and 0 < q.idle_wait(True) <= 0.3  # mb 1 is not due yet
    time.sleep(0.35)
    assert q.next(True, never) == late


def test_a_requeued_microbatch_is_injected_first_and_at_once():
    later = Route(microbatch=0, origin="h0", stages=(1,), peers=("r1",), inject_after=60.0)
    q = OperationQueue([later])
    again = Route(microbatch=3, origin="h0", stages=(2,), peers=("r2",), inject_after=5.0)
    q.inject_now(again)
    assert q.injecting(3) and q.injecting(0) and not q.injecting(7)
    taken = q.next(True, never)
    assert taken.microbatch == 3 and taken.inject_after == 0.0
    assert q.next(True, never) is None  # microbatch 0 is due in a minute
