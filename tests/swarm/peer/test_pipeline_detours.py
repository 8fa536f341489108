"""In-flight detours: executors of one iteration go around a gone peer and still compute exactly the same thing.

Each peer's `PipelineExecutor` runs in a thread of this process on its own `StageWorker`; messages between them
go through in-memory queues (scaffolding standing in for the transport, whose own tests are elsewhere). A send to
a "dead" peer comes back as `Undelivered(unreachable=True)`, as the peer's transport reports a refused stream. A
broken microbatch's report goes straight to every other peer's inbox, as the peers' gossip hands it to their main
loops.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from concurrent.futures import Future

import pytest
import torch

from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker
from scheduler.detour import detour, detour_violation
from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.constants import MAX_MICROBATCH_ATTEMPTS
from swarm.net.delivery import Inbound, Undelivered
from swarm.peer.attempts import Requeue
from swarm.peer.awaited_backwards import AwaitedBackwards
from swarm.peer.iteration_clock import stall_limits_for
from swarm.peer.pipeline import PipelineExecutor
from swarm.wire import Direction, HopHeader

pytestmark = pytest.mark.timeout(120)

MODEL = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
SPLIT = (1, 1, 1, 1)
RUN = "detours"
# 4 stages, R = 3 (one of stages 1..3 skipped per path); two peers on stages 1 and 2, one on stage 3
PLACEMENT = {"h0": 0, "h1": 0, "a1": 1, "b1": 1, "a2": 2, "b2": 2, "a3": 3}
ROUTES = [("h0", (1, 2), ("a1", "a2")), ("h0", (1, 3), ("a1", "a3")), ("h0", (2, 3), ("b2", "a3")),
          ("h1", (1, 2), ("b1", "b2")), ("h1", (1, 2), ("a1", "b2")), ("h1", (2, 3), ("a2", "a3"))]


def schedule(routes=ROUTES, placement=PLACEMENT) -> Schedule:
    rules = PathRules(num_stages=4, stages_per_path=3, max_swaps=1, max_swap_distance=1)
    return Schedule(epoch=0, rules=rules, placement=dict(placement), memory=dict.fromkeys(placement, 4),
                    routes=tuple(Route(microbatch=i, origin=o, stages=s, peers=p)
                                 for i, (o, s, p) in enumerate(routes)),
                    run_id=RUN)


def batches(sched: Schedule, origin: str) -> dict[int, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    tokens = {i: torch.randint(0, MODEL.vocab_size, (2, 9), generator=gen) for i in range(len(sched.routes))}
    return {r.microbatch: tokens[r.microbatch] for r in sched.routes if r.origin == origin}


class Iteration:
    """One iteration of `sched` on the live peers; `dead` peers never answer, `dies_after` peers stop working
    after handling that many messages (their activations die with them), `frozen` peers accept messages (their
    transport acknowledges them) but never process them, and `sitting` ones do the same while answering checks;
    `withholding` ones run their forwards but never pass them on (as `--fault withhold-activations`).
    With `hop_deadline`, a peer whose backward is that late checks on the peer it sent the forward to, as `Peer`
    probes it: a dead or frozen one is then gone; with `probe_timeout` too, a backward still not back past its stall
    limit (`stall_limits_for`) breaks its attempt at that peer."""

    def __init__(self, sched: Schedule, dead: set[str] = frozenset(), gone: set[str] = frozenset(),
                 dies_after: dict[str, int] | None = None, frozen: set[str] = frozenset(),
                 sitting: set[str] = frozenset(), withholding: set[str] = frozenset(),
                 hop_deadline: float | None = None, probe_timeout: float | None = None):
        self.sched, self.dead, self.dies_after = sched, set(dead), dict(dies_after or {})
        self.frozen, self.sitting, self.withholding = set(frozen), set(sitting), set(withholding)
        self.checked: list[tuple[str, str, int]] = []
        self.inbox: dict[str, queue.Queue] = {p: queue.Queue() for p in sched.placement}
        self.broken: list[tuple[str, Requeue]] = []
        """(reporter, report) of each broken microbatch attempt reported to another holder."""
        self.given_up: list[tuple[str, int, str]] = []
        """(holder, microbatch, why) of each microbatch its holder could not re-queue: the iteration is over."""
        self.gone = frozenset(gone)  # replaced, never mutated: executor threads read it
        self.left_out: frozenset[str] = frozenset()
        """Holders the scheduler declared gone (their microbatches are committed without them); set by a test."""
        self.workers = {p: StageWorker(p, s, MODEL, SPLIT, OptimConfig(), dtype=torch.float64, seed=0)
                        for p, s in sched.placement.items()}
        deadlines = {r.microbatch: hop_deadline for r in sched.routes} if hop_deadline else None
        self.executors = {
            p: PipelineExecutor(me=p, worker=self.workers[p], schedule=sched, run_id=RUN, iteration=0,
                                send=self._sender(p), batches=batches(sched, p) if s == 0 else None,
                                gone=lambda: self.gone, left_out=lambda: self.left_out,
                                broken=self._reporter(p),
                                give_up=lambda mb, why, p=p: self.given_up.append((p, mb, why)),
                                awaited=AwaitedBackwards(deadlines, self._checker(p),
                                                         stall_limits_for(sched, p, deadlines, probe_timeout)
                                                         if deadlines and probe_timeout else None))
            for p, s in sched.placement.items() if p not in dead}
        self.committed = threading.Event()

    def _sender(self, me: str):
        def send(peer: str, header: HopHeader, tensor: torch.Tensor) -> Future:
            sent: Future = Future()
            if me in self.withholding and header.direction == Direction.FORWARD:
                sent.set_result(True)  # as far as it says, it went
            elif peer in self.dead:
                self.inbox[me].put(Undelivered(peer, header, tensor.clone(), unreachable=True))
                sent.set_result(False)
            else:
                self.inbox[peer].put(Inbound(me, header, tensor.clone()))
                sent.set_result(True)
            return sent
        return send

    def _reporter(self, me: str):
        def report(r: Requeue) -> None:
            self.broken.append((me, r))
            for peer, inbox in self.inbox.items():
                if peer != me:
                    inbox.put(dataclasses.replace(r, reporter=me))  # the gossip names who said it
        return report

    def _checker(self, me: str):
        def check(peer: str, microbatch: int) -> None:
            self.checked.append((me, peer, microbatch))
            if peer in self.dead or peer in self.frozen:
                self.gone = self.gone | {peer}
        return check

    def _receive(self, me: str):
        def receive(timeout: float) -> list:
            if me in self.frozen or me in self.sitting:
                time.sleep(timeout)
                return []
            if self.dies_after.get(me, 1) <= 0:  # it handled its last messages: from now on it is dead
                self.dead.add(me)
                return []
            out = []
            try:
                out.append(self.inbox[me].get(timeout=timeout))
                while True:
                    out.append(self.inbox[me].get_nowait())
            except queue.Empty:
                pass
            if me in self.dies_after:
                keep = out[:self.dies_after[me]]
                self.dies_after[me] -= len(keep)
                return keep
            return out
        return receive

    def _serve(self, me: str, errors: list) -> None:
        ex = self.executors[me]
        try:
            ex.run(self._receive(me), deadline=20, aborted=lambda: me in self.dead or bool(self.given_up),
                   settled=self.committed.is_set)
            while not self.committed.is_set() and me not in self.dead and not self.given_up:
                ex.handle(self._receive(me)(0.02))  # a peer waiting for the commit still serves detours
        except Exception as e:  # noqa: BLE001 - reported to the test
            if me not in self.dead and not self.given_up:
                errors.append((me, e))

    def run(self, timeout: float = 60) -> None:
        errors: list = []
        threads = {p: threading.Thread(target=self._serve, args=(p, errors), daemon=True) for p in self.executors}
        for t in threads.values():
            t.start()
        end = time.monotonic() + timeout  # the scheduler commits once every data holder is done
        while not all(self.executors[h].done for h in self.sched.data_holders if h not in self.left_out) and \
                not self.given_up and not errors:
            assert time.monotonic() < end, "the iteration did not finish"
            time.sleep(0.01)
        self.committed.set()
        for t in threads.values():
            t.join(timeout)
        assert not errors, errors

    def losses(self) -> dict[int, float]:
        return {mb: loss for h in self.sched.data_holders for mb, loss in self.executors[h].result.loss_of.items()}

    def holders_requeued(self) -> int:
        return sum(len(self.executors[h].result.requeued) for h in self.sched.data_holders)

    def stage_gradients(self, stage: int) -> dict[str, torch.Tensor]:
        sums = [self.workers[p].gradient_sums() for p in self.sched.stage_peers(stage) if p in self.executors]
        return {n: sum(s[n] for s in sums) for n in sums[0]}


def test_forwards_to_a_gone_peer_go_to_its_stage_mate_and_compute_the_same():
    sched = schedule()
    reference = Iteration(sched)
    reference.run()
    detoured = Iteration(sched, dead={"a1"})  # a1 died; nobody has told the others yet: sends to it fail
    detoured.run()
    assert not detoured.broken
    assert detoured.losses() == reference.losses()  # same-stage peers hold the same weights
    for stage in (1, 2, 3):
        ref, got = reference.stage_gradients(stage), detoured.stage_gradients(stage)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=1e-10, atol=1e-12)
    # a1's three microbatches went to b1, its only stage mate, which ran one backward for each on top of its own
    assert detoured.executors["b1"].result.backward_done == 1 + 3
    assert detoured.workers["b1"].visits == 4
    assert sum(ex.result.detours for ex in detoured.executors.values()) == 3


def test_a_peer_declared_gone_is_not_even_tried():
    sched = schedule()
    it = Iteration(sched, dead={"a2"}, gone={"a2"})
    it.run()
    assert not it.broken
    for ex in it.executors.values():
        assert "a2" not in ex.unreachable  # detoured up front, no failed send needed
    assert it.executors["b2"].result.backward_done == 3 + 2


def test_a_stage_with_no_live_peer_is_replaced_by_another_stage_the_path_may_take():
    sched = schedule()
    it = Iteration(sched, dead={"a3"}, gone={"a3"})
    it.run()
    assert not it.broken
    assert len(it.losses()) == len(sched.routes)
    for mb in (1, 2, 5):  # the paths through stage 3 now take the one stage they skipped
        route = it.executors[sched.routes[mb].origin].in_use[mb]
        assert 3 not in route.stages and len(route.stages) == 2
        assert detour_violation(sched, sched.routes[mb], route.nodes, route.stages) is None


def assert_same_gradients(got: Iteration, reference: Iteration) -> None:
    """Every stage's gradient sum and visits as in `reference`: each microbatch counted exactly once everywhere."""
    for stage in range(reference.sched.num_stages):
        ref, out = reference.stage_gradients(stage), got.stage_gradients(stage)
        for name in ref:
            torch.testing.assert_close(out[name], ref[name], rtol=1e-10, atol=1e-12)
        peers = reference.sched.stage_peers(stage)
        assert sum(got.workers[p].visits for p in peers) == sum(reference.workers[p].visits for p in peers)


def test_a_microbatch_whose_activations_died_is_requeued_and_counted_once_by_every_stage():
    sched = schedule()
    reference = Iteration(sched)
    reference.run()
    # a2 handles its first message (a forward: it passes it on, the loss is computed, the backward comes back
    # through the stages after it) and dies: that microbatch's backward cannot pass it
    it = Iteration(sched, dies_after={"a2": 1})
    # the scheduler's notice that a2 is gone comes after its record expired
    threading.Timer(0.5, lambda: setattr(it, "gone", it.gone | {"a2"})).start()
    it.run()
    requeued = {mb for h in sched.data_holders for mb, _ in it.executors[h].result.requeued}
    assert requeued and not it.given_up
    assert requeued | {r.microbatch for _, r in it.broken} <= {r.microbatch for r in sched.routes if "a2" in r.peers}
    assert all(r.gone == "a2" for _, r in it.broken)
    # the rest of the iteration went on: every microbatch's loss once, and exactly the reference's gradients
    assert it.losses() == pytest.approx(reference.losses(), rel=1e-12)
    assert_same_gradients(it, reference)
    assert not it.workers["a2"].visits


def test_stages_a_broken_backward_had_passed_rerun_the_requeued_microbatch_without_counting_it_again():
    # only microbatch 5 passes a2: h1 -> a2 (stage 2) -> a3 (stage 3)
    routes = [("h0", (1, 2), ("a1", "b2")), ("h0", (1, 3), ("a1", "a3")), ("h0", (2, 3), ("b2", "a3")),
              ("h1", (1, 2), ("b1", "b2")), ("h1", (1, 2), ("a1", "b2")), ("h1", (2, 3), ("a2", "a3"))]
    sched = schedule(routes)
    reference = Iteration(sched)
    reference.run()
    # a2 passes microbatch 5 on and dies: its loss is computed and its backward passes a3 (stage 3's gradient
    # holds it) before it finds a2 gone
    it = Iteration(sched, dies_after={"a2": 1})
    it.run()
    assert [(reporter, r.microbatch, r.gone) for reporter, r in it.broken] == [("a3", 5, "a2")]
    assert it.executors["h1"].result.requeued == [(5, 1)]
    assert it.executors["h1"].in_use[5].peers == ("b2", "a3")
    # a3 ran microbatch 5's backward twice, the second time without accumulating; the head counted its loss once
    assert it.executors["a3"].result.backward_done == reference.executors["a3"].result.backward_done + 1
    assert it.workers["a3"].visits == reference.workers["a3"].visits
    assert it.executors["h1"].result.losses == 3
    assert it.losses() == pytest.approx(reference.losses(), rel=1e-12)
    assert_same_gradients(it, reference)


def test_a_backward_late_past_its_hop_deadline_gets_the_next_hop_checked_and_a_frozen_one_found():
    sched = schedule()
    reference = Iteration(sched)
    reference.run()
    # a2's transport takes its forwards, but the process holding them never runs again; nobody is told
    it = Iteration(sched, frozen={"a2"}, hop_deadline=1.0)
    start = time.monotonic()
    it.run(timeout=30)
    assert time.monotonic() - start < 15  # found by the deadline, not by the scheduler's expiry of a2
    assert "a2" in {peer for _, peer, _ in it.checked}
    assert it.holders_requeued() >= 1 and not it.given_up
    assert all(r.gone == "a2" for _, r in it.broken)
    assert it.losses() == pytest.approx(reference.losses(), rel=1e-12)
    assert_same_gradients(it, reference)


def test_a_next_hop_that_answers_but_holds_its_microbatches_is_given_up_on_and_gone_around():
    sched = schedule()
    reference = Iteration(sched)
    reference.run()
    # a2 takes its forwards and answers every check, but never passes them on (stuck, or sitting on them on
    # purpose): checking on it finds nothing wrong, and without a stall limit the iteration waits for its deadline
    it = Iteration(sched, sitting={"a2"}, hop_deadline=0.3, probe_timeout=0.3)
    start = time.monotonic()
    it.run(timeout=30)
    assert time.monotonic() - start < 10
    assert "a2" in {peer for _, peer, _ in it.checked} and "a2" not in it.gone  # checked, and it answered
    # the peer next to it gave up on it (a1 for h0's microbatch 0; h1 itself for microbatch 5): nobody else is
    # blamed, h0 does not blame a1 for the backward a1 never got
    assert it.broken and {r.gone for _, r in it.broken} == {"a2"}
    assert it.holders_requeued() >= 1 and not it.given_up
    assert it.losses() == pytest.approx(reference.losses(), rel=1e-12)
    assert_same_gradients(it, reference)


def test_a_relay_that_withholds_and_blames_the_peer_after_it_is_gone_around_and_reported():
    # every path visits stages 1, 2 and 3, and stage 3 has one peer: a2 runs its forwards but passes none on, then
    # (past its stall limit) reports a3, the peer after it, for holding them; nothing can go around a3
    rules = PathRules(num_stages=4, stages_per_path=4, max_swaps=0, max_swap_distance=1)
    placement = {"h0": 0, "h1": 0, "a1": 1, "b1": 1, "a2": 2, "b2": 2, "a3": 3}
    routes = [("h0", ("a1", "a2", "a3")), ("h0", ("b1", "b2", "a3")), ("h1", ("a1", "a2", "a3")),
              ("h1", ("b1", "b2", "a3"))]
    sched = Schedule(epoch=0, rules=rules, placement=placement, memory=dict.fromkeys(placement, 4),
                     routes=tuple(Route(microbatch=i, origin=o, stages=(1, 2, 3), peers=p)
                                  for i, (o, p) in enumerate(routes)), run_id=RUN)
    reference = Iteration(sched)
    reference.run()
    it = Iteration(sched, withholding={"a2"}, hop_deadline=0.3, probe_timeout=0.3)
    it.run(timeout=30)
    assert not it.given_up  # the iteration was not run again: the holders went around the reporter instead
    blamed = {(reporter, r.microbatch): r.gone for reporter, r in it.broken}
    assert blamed[("a2", 0)] == blamed[("a2", 2)] == "a3"
    # a3 then served both microbatches' next attempts (through b2): each holder reports a2's word as false, so the
    # scheduler hears two peers against a2, and one (a2's own) against a3
    assert blamed[("h0", 0)] == blamed[("h1", 2)] == "a2"
    assert {r.gone for reporter, r in it.broken if reporter != "a2"} == {"a2"}
    assert it.executors["h0"].disproved == it.executors["h1"].disproved == {"a2"}  # gone around from now on
    assert it.losses() == pytest.approx(reference.losses(), rel=1e-12)
    assert_same_gradients(it, reference)


def drain(q: queue.Queue) -> list:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def test_a_relay_drops_what_it_keeps_of_an_attempt_broken_further_on():
    sched = schedule()
    it = Iteration(sched)
    h0, a1 = it.executors["h0"], it.executors["a1"]
    h0.handle([])  # h0's microbatches are due at once: microbatches 0 and 1 go to a1
    a1.handle(drain(it.inbox["a1"]))  # a1 runs their forwards and keeps their activations for the backward
    assert {0, 1} <= set(it.workers["a1"].stashed)
    # a peer further on reports microbatch 0's attempt broken: h0 re-queues it, so a1's activations of it are stale
    # and only hold a memory slot other forwards may wait for
    a1.handle([Requeue(iteration=0, epoch=0, microbatch=0, attempt=0, gone="a2")])
    assert 0 not in it.workers["a1"].stashed and 1 in it.workers["a1"].stashed
    assert not a1.result.requeued and not it.broken  # not its microbatch to re-queue, nor its break to report


def test_a_requeue_names_the_current_attempt_of_an_injected_microbatch_and_gives_up_at_the_limit():
    sched = schedule()
    it = Iteration(sched)
    ex = it.executors["h0"]
    ex.requeue(Requeue(iteration=0, epoch=0, microbatch=0, attempt=0, gone="a2"))  # not injected yet (a forgery)
    assert not ex.result.requeued
    ex.handle([])  # h0's microbatches are due at once: injected, their forwards sent
    ex.requeue(Requeue(iteration=0, epoch=0, microbatch=3, attempt=0, gone="b1"))  # h1's microbatch, not h0's
    assert not ex.result.requeued
    for attempt in range(MAX_MICROBATCH_ATTEMPTS):
        ex.requeue(Requeue(iteration=0, epoch=0, microbatch=0, attempt=attempt, gone="a2"))
        assert ex.result.requeued[-1] == (0, attempt + 1)
        ex.requeue(Requeue(iteration=0, epoch=0, microbatch=0, attempt=attempt, gone="a2"))  # that attempt again
        assert len(ex.result.requeued) == attempt + 1 and not it.given_up
        ex.handle([])  # the new attempt is injected, around a2
    ex.requeue(Requeue(iteration=0, epoch=0, microbatch=0, attempt=MAX_MICROBATCH_ATTEMPTS, gone="a2"))
    assert len(ex.result.requeued) == MAX_MICROBATCH_ATTEMPTS and [mb for _, mb, _ in it.given_up] == [0]


@pytest.mark.parametrize("maybe_ran, counted", [(False, {3}), (True, {2, 3})])
def test_a_gone_peer_that_may_have_run_the_backward_has_its_stage_counted_too(maybe_ran, counted):
    """Microbatch 5 (h1 -> a2 -> a3) had its loss computed; a2 is reported after a send to it failed. Dead, it
    never ran the backward (stage 2 counts it on the new attempt); a timeout or refusal leaves that open, so
    stage 2 is told it holds it already: a wrongly suspected a2 must not make stage 2 count it twice."""
    sched = schedule()
    it = Iteration(sched)
    ex = it.executors["h1"]
    ex.queue.pending = [r for r in ex.queue.pending if r.microbatch != 5]  # injected ...
    ex.attempts.count_head(5)  # ... and its loss computed
    ex.requeue(Requeue(iteration=0, epoch=0, microbatch=5, attempt=0, gone="a2", maybe_ran=maybe_ran))
    assert ex.result.requeued == [(5, 1)] and ex.attempts.counted(5) == frozenset(counted)
    assert ex.in_use[5].peers == ("b2", "a3") and ex.queue.pending[0].microbatch == 5


def test_forged_detours_are_dropped():
    sched = schedule()
    it = Iteration(sched)
    ex = it.executors["b1"]
    act = torch.zeros(2, 8, MODEL.dim, dtype=torch.float64)

    def forward(route, stages, sender):
        return Inbound(sender, HopHeader(run=RUN, iteration=0, microbatch=0, route=route, hop=1,
                                         direction=Direction.FORWARD, epoch=0, dtype="", shape=(),
                                         stages=stages), act)
    ex.handle([forward(("h0", "b1", "a3"), (0, 1, 2), "h0")])  # a3 serves stage 3, not 2
    ex.handle([forward(("h1", "b1", "a2"), (0, 1, 2), "h1")])  # microbatch 0 starts at h0
    ex.handle([forward(("h0", "b1", "a2", "a3"), (0, 1, 2, 3), "h0")])  # R + 1 stages
    assert ex.result.dropped == 3 and not it.workers["b1"].stashed


def test_detour_picks_live_stage_mates_by_microbatch_and_none_when_nothing_fits():
    sched = schedule()
    r = sched.routes[0]  # h0 -> a1 -> a2
    assert detour(sched, r, 1, {"a1"}).peers == ("b1", "a2")
    assert detour(sched, r, 2, {"a2"}).peers == ("a1", "b2")
    only_three = schedule(placement={**PLACEMENT, "a2": 3, "b2": 3})  # stage 2 has nobody left
    r = only_three.routes[1]  # h0 -> a1 (1) -> a3 (3): its stage 1 cannot move (stage 2 and 3 are taken or empty)
    assert detour(only_three, r, 1, {"a1", "b1"}) is None
    with pytest.raises(ValueError):
        detour(sched, r, 0, {"h0"})


def test_relays_run_none_of_a_holder_declared_gone_and_free_the_slots_its_microbatches_hold():
    sched = schedule()
    it = Iteration(sched)
    h0, a1 = it.executors["h0"], it.executors["a1"]
    h0.handle([])  # h0's microbatches are due at once: 0 and 1 go to a1, 2 to b2
    a1.handle(drain(it.inbox["a1"]))  # a1 runs their forwards and keeps their activations for the backward
    assert {0, 1} <= set(it.workers["a1"].stashed)
    owed = a1.expected
    # the scheduler declares h0 gone: the iteration commits without h0's microbatches, whose backwards cannot start
    # (their loss is h0's to compute) or must not count
    it.left_out = frozenset({"h0"})
    a1.handle([])
    assert not it.workers["a1"].stashed and a1.result.left_out == 2  # its memory slots are free for h1's forwards
    assert a1.expected == owed - 2  # it owes h1's microbatch 4 only
    for relay in ("a2", "a3", "b2"):  # h0's forwards already on their way are dropped unrun
        it.executors[relay].handle(drain(it.inbox[relay]))
        assert not it.workers[relay].stashed and it.executors[relay].result.left_out >= 1
    assert not it.broken and not it.checked


def test_an_iteration_whose_holder_died_and_was_declared_gone_finishes_the_other_holders_microbatches():
    sched = schedule()
    reference = Iteration(sched)
    reference.run()
    # h0 injects its first microbatch and dies; the scheduler has declared it gone by the time it reaches a1
    it = Iteration(sched, dies_after={"h0": 0}, gone={"h0"}, hop_deadline=1.0)
    it.left_out = frozenset({"h0"})
    it.run(timeout=30)
    theirs = {r.microbatch for r in sched.routes if r.origin == "h1"}
    assert not it.broken and not it.given_up  # nothing went looking for h0's microbatch
    assert all(mb in theirs for _, _, mb in it.checked)  # (a check of h1's is the load on this machine)
    assert it.losses() == pytest.approx({mb: reference.losses()[mb] for mb in theirs}, rel=1e-12)
    for relay in ("a1", "b1", "a2", "b2", "a3"):  # each ran h1's microbatches only, and keeps nothing
        assert it.workers[relay].visits == sum(relay in sched.routes[mb].peers for mb in theirs)
        assert not it.workers[relay].stashed
    assert it.executors["a1"].result.left_out == 1
