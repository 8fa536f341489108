"""A joiner's stage state from hostile veterans (issue #17). Before, a joiner loaded whatever the first same-stage
sender's two STATE messages held: NaN weights, a step count of -1. Now `load_state` refuses non-finite state and
impossible counts before touching the worker, and `receive_agreed_state` takes a state only once two veterans vouch
for its digest (when the stage has two), so one faulty veteran of three cannot poison a joiner. The last tests run
the whole hand-over between `StageKeeper`s: veterans equip, the joiner starts, following the re-plans of its first
iteration (a veteran that froze and was taken for gone stops counting), and gives its placement up, staying in the
run, when no agreed state comes."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import replace

import pytest
import torch

from peers.checkpoint import stage_tensors
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker, WorkerError
from scheduler.path_rules import PathRules
from scheduler.schedule import Schedule
from swarm.events import EVENT_ATTR
from swarm.net.delivery import Inbound
from swarm.peer.mailbox import Inbox
from swarm.peer.options import PeerOptions
from swarm.peer.stage_keeper import JoinAbandoned, StageKeeper
from swarm.run_config import RunConfig
from swarm.stage_group.state_transfer import (
    load_state,
    receive_agreed_state,
    send_digest,
    send_state,
    state_senders,
)
from swarm.wire import HopHeader

pytestmark = pytest.mark.timeout(60)

MICRO = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
SPLIT = (2, 1, 1)


def worker(peer: str, seed: int = 0) -> StageWorker:
    return StageWorker(peer, 1, MICRO, SPLIT, OptimConfig(grad_clip=0), seed=seed)


def stepped(peer: str, steps: int = 2) -> StageWorker:
    """A stage-1 worker after `steps` optimizer steps; every call gives bit-identical state (a stage group's)."""
    w = worker(peer)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        out = w.forward(step, torch.randn(2, 8, MICRO.dim, generator=gen))
        w.backward(step, torch.randn(out.shape, generator=gen))
        w.set_mean_gradients(w.gradient_sums(), w.visits)
        w.step()
    return w


def sent(sender: StageWorker, *, digest_only: bool = False, to: str = "joiner") -> list[Inbound]:
    """What `sender` sends a joiner: its state (parts 0 and 1), or its digest (part 2)."""
    out: list[Inbound] = []

    def send(peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
        out.append(Inbound(sender.peer_id, header, tensor.clone()))

    (send_digest if digest_only else send_state)(me=sender.peer_id, worker=sender, to=to, run_id="r", iteration=5,
                                                 epoch=1, send=send)
    return out


def poisoned(messages: list[Inbound], part: int, value: float, count: int = 7) -> list[Inbound]:
    """`messages` with the first `count` values of `part` set to `value` (count 0: all)."""
    out = []
    for m in messages:
        t = m.tensor.clone()
        if m.header.microbatch == part:
            t[:count or t.numel()] = value
        out.append(Inbound(m.sender, m.header, t))
    return out


def inbox(*batches: list[Inbound]):
    """`receive` handing out `batches` one call at a time, then nothing."""
    pending = list(batches)
    return lambda timeout: pending.pop(0) if pending else []


def weights(w: StageWorker) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in w.module.state_dict().items()}


@pytest.mark.parametrize("part, value, count, why", [(0, float("nan"), 7, "not finite"),
                                                     (1, float("inf"), 7, "not finite"), (1, -1.0, 0, "negative")])
def test_non_finite_or_negative_state_is_refused_before_anything_is_loaded(part, value, count, why):
    joiner = worker("joiner", seed=5)
    before = weights(joiner)
    messages = {m.header.microbatch: m for m in poisoned(sent(stepped("vet")), part, value, count)}
    with pytest.raises(WorkerError, match=why):
        load_state(joiner, messages)
    assert all(torch.equal(v, before[k]) for k, v in joiner.module.state_dict().items())
    assert joiner.steps == 0


def test_a_negative_step_count_is_refused():
    messages = {m.header.microbatch: Inbound(m.sender, replace(m.header, weight=0), m.tensor)
                for m in sent(stepped("vet"))}
    with pytest.raises(WorkerError, match="not negative"):
        load_state(worker("joiner"), messages)


def test_one_faulty_veteran_of_three_is_outvoted(caplog):
    honest_a, liar, honest_b = stepped("vet-a"), stepped("vet-b"), stepped("vet-c")
    joiner = worker("joiner", seed=5)
    receive = inbox(poisoned(sent(liar), 0, 123.0), sent(honest_a), sent(honest_b, digest_only=True))
    with caplog.at_level(logging.WARNING):
        parts = receive_agreed_state(joiner, receive, senders=["vet-a", "vet-b", "vet-c"], needed=2, timeout=5.0)
    assert {p: m.sender for p, m in parts.items()} == {0: "vet-a", 1: "vet-a"}
    assert load_state(joiner, parts) == 2
    for mine, theirs in zip(stage_tensors(joiner), stage_tensors(honest_a), strict=True):
        assert all(torch.equal(mine[k].reshape(-1), theirs[k].reshape(-1).to(mine[k].dtype)) for k in mine)
    events = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert any(e["event"] == "state_refused" and e["sender"] == "vet-b" for e in events)


def test_a_nan_state_is_refused_and_the_agreed_one_taken():
    honest_a, liar, honest_b = stepped("vet-a"), stepped("vet-b"), stepped("vet-c")
    receive = inbox(poisoned(sent(liar), 0, float("nan")), sent(honest_b, digest_only=True), sent(honest_a))
    parts = receive_agreed_state(worker("joiner"), receive, senders=["vet-a", "vet-b", "vet-c"], needed=2,
                                 timeout=5.0)
    assert parts[0].sender == "vet-a"


def test_two_veterans_that_disagree_stop_the_join_instead_of_poisoning_it():
    receive = inbox(sent(stepped("vet-a")), poisoned(sent(stepped("vet-b")), 0, 123.0))
    with pytest.raises(TimeoutError, match="agree"):
        receive_agreed_state(worker("joiner"), receive, senders=["vet-a", "vet-b"], needed=2, timeout=1.0)


def test_two_veterans_on_different_hardware_agree_up_to_rounding():
    """A GPU and a CPU member round AdamW's step differently: their states differ in the last place, not beyond."""
    gpu = sent(stepped("vet-a"))
    cpu = [Inbound("vet-b", m.header, m.tensor * (1 + 1e-7) if m.header.microbatch == 0 else m.tensor)
           for m in sent(stepped("vet-b"))]
    parts = receive_agreed_state(worker("joiner"), inbox(gpu, cpu), senders=["vet-a", "vet-b"], needed=2,
                                 timeout=5.0)
    assert parts[0].sender == "vet-a"


def test_state_from_a_peer_that_is_not_a_veteran_is_refused():
    receive = inbox(sent(stepped("stranger")))
    with pytest.raises(TimeoutError):
        receive_agreed_state(worker("joiner"), receive, senders=["vet-a"], needed=1, timeout=1.0)
    parts = receive_agreed_state(worker("joiner"), inbox(sent(stepped("vet-a"))), senders=["vet-a"], needed=1,
                                 timeout=5.0)
    assert parts[0].sender == "vet-a"


def test_the_senders_are_the_stages_veterans_not_its_joiners_or_movers():
    placement = {"h": 0, "a": 1, "b": 1, "j": 1, "m": 1, "z": 1, "x": 2}
    schedule = Schedule(epoch=3, rules=PathRules(3, 3), placement=placement, memory=dict.fromkeys(placement, 2),
                        routes=(), meta={"joiners": ["j"], "handover": {"m": "q"}, "restore": {"z": "x"}})
    assert state_senders(schedule, 1) == ["a", "b"]


class Wire:
    """In-memory STATE delivery between keepers: each peer's inbox, and an outbox per sender (`tamper`ing what a
    faulty one sends); `sent` records (sender, receiver, part)."""

    def __init__(self, delivers: bool = True) -> None:
        self.inboxes: dict[str, Inbox] = {}
        self.sent: list[tuple[str, str, int]] = []
        self.delivers = delivers
        """False: every send fails (as when the receiver refuses it), nothing arrives."""

    def outbox(self, me: str, tamper=None):
        wire = self

        class Out:
            def send(self, peer: str, header: HopHeader, tensor: torch.Tensor) -> Future:
                wire.sent.append((me, peer, header.microbatch))
                if tamper is not None:
                    tensor = tamper(header, tensor)
                if wire.delivers:
                    wire.inboxes[peer].put(Inbound(me, header, tensor.clone()), "state")
                done = Future()
                done.set_result(wire.delivers)
                return done

        return Out()


def keeper(peer: str, wire: Wire, tamper=None, *, state_timeout: float = 30.0) -> StageKeeper:
    config = RunConfig.from_tables({}, run_id="r", iterations=10, min_peers=6, stages=3, skip=0.0, seed=0)
    wire.inboxes[peer] = Inbox()
    return StageKeeper(peer, PeerOptions(initial_peers=(), identity_path="", run_id="r"), config,
                       config.model_config(64), inbox=wire.inboxes[peer], outbox=wire.outbox(peer, tamper),
                       dht=lambda: None, loss_seconds=0.0, state_timeout=state_timeout)


def epoch(number: int, joiner: bool) -> Schedule:
    """Stage 1 served by a, b, c, and by joiner j where `joiner`."""
    placement = {"h": 0, "a": 1, "b": 1, "c": 1, "x": 2, **({"j": 1} if joiner else {})}
    return Schedule(epoch=number, rules=PathRules(3, 3), placement=placement, memory=dict.fromkeys(placement, 2),
                    routes=(), meta={"joiners": ["j"]} if joiner else {})


def epochs() -> tuple[Schedule, Schedule]:
    """Epoch 1: stage 1 served by a, b, c; epoch 2 adds joiner j to it from iteration 5."""
    return epoch(1, False), epoch(2, True)


@pytest.mark.parametrize("liar", [None, "a", "b"])
def test_a_joiner_takes_the_state_two_veterans_agree_on(liar):
    """The first two veterans send the state, the third its digest; one lying veteran is out-voted."""
    wire = Wire()
    poison = lambda h, t: t + 1.0 if h.microbatch == 0 else t  # noqa: E731
    veterans = {p: keeper(p, wire, poison if p == liar else None) for p in ("a", "b", "c")}
    joiner = keeper("j", wire)
    old, new = epochs()
    for k in veterans.values():
        k.start(old, 0)
        w, gen = k.worker, torch.Generator().manual_seed(3)  # one identical step: state the seed does not give
        out = w.forward(0, torch.randn(2, 8, w.config.dim, generator=gen))
        w.backward(0, torch.randn(out.shape, generator=gen))
        w.set_mean_gradients(w.gradient_sums(), 1)
        w.step()
    for k in veterans.values():
        k.equip(new, old, 5)
    assert sorted(wire.sent) == [("a", "j", 0), ("a", "j", 1), ("b", "j", 0), ("b", "j", 1), ("c", "j", 2)]
    joiner.start(new, 5)
    honest = veterans["c"].worker.module.state_dict()
    assert joiner.worker.steps == 1
    assert all(torch.equal(v, honest[k]) for k, v in joiner.worker.module.state_dict().items())


@pytest.mark.parametrize("delivers", [True, False])
def test_a_replan_from_the_same_iteration_sends_the_joiner_its_state_once(delivers):
    """A re-plan from the same iteration (another peer died before it ran) names the same joiner again. It holds the
    state already: a copy would be refused only after `STATE_ADMISSION_WAIT`, holding up the one sender thread of
    stage state meanwhile (another joiner's state behind it). A state that was not delivered, or a joiner that left
    and came back, gets it again."""
    wire = Wire(delivers)
    veterans = {p: keeper(p, wire) for p in ("a", "b", "c")}
    keeper("j", wire)
    for k in veterans.values():
        k.start(epoch(1, False), 0)
    for k in veterans.values():
        k.equip(epoch(2, True), epoch(1, False), 5)
    assert len(wire.sent) == 5  # two states of two parts, a digest
    for k in veterans.values():
        k.equip(epoch(3, True), epoch(2, True), 5)
    assert len(wire.sent) == (5 if delivers else 10)
    for k in veterans.values():  # j is gone (epoch 4), then joins again
        k.equip(epoch(5, True), epoch(4, False), 5)
    assert len(wire.sent) == (10 if delivers else 15)


def two_veterans(number: int, placement: dict[str, int] | None = None, joiners: tuple[str, ...] = ("j",)) -> Schedule:
    """Stage 1 served by veterans a and b, and by joiner j from iteration 5 (or `placement`)."""
    placement = placement or {"h": 0, "a": 1, "b": 1, "j": 1, "x": 2}
    return Schedule(epoch=number, rules=PathRules(3, 3), placement=placement, memory=dict.fromkeys(placement, 2),
                    routes=(), meta={"joiners": list(joiners), "start_iteration": 5})


def veterans_a_and_b(wire: Wire, tamper_b=None) -> tuple[StageKeeper, StageKeeper, Schedule, Schedule]:
    """Veterans a and b serving stage 1 under epoch 1, and epoch 2, which adds joiner j to it from iteration 5."""
    a, b = keeper("a", wire), keeper("b", wire, tamper_b)
    old = two_veterans(1, {"h": 0, "a": 1, "b": 1, "x": 2}, joiners=())
    for k in (a, b):
        k.start(old, 0)
    return a, b, old, two_veterans(2)


def after(seconds: float, schedule: Schedule):
    """`revised` for a joiner: nothing newer until `seconds` from now, then `schedule` (a re-plan published)."""
    at = time.monotonic() + seconds
    return lambda: schedule if time.monotonic() >= at else None


def test_a_joiner_whose_veteran_froze_takes_the_state_once_a_replan_drops_that_veteran():
    """Seen in a churn run: veteran a is frozen (SIGSTOP) but not yet taken for gone, so the joiner hears b alone
    and two voices are needed. The scheduler then declares a gone and re-plans the iteration without it: the joiner
    takes b's state (already received; b does not send it twice) instead of waiting until its timeout and exiting."""
    wire = Wire()
    _, b, old, new = veterans_a_and_b(wire)
    joiner = keeper("j", wire, state_timeout=30.0)
    b.equip(new, old, 5)  # a is frozen: it equips nobody
    without_a = two_veterans(3, {"h": 0, "b": 1, "j": 1, "x": 2})
    b.equip(without_a, new, 5)
    assert [s for s in wire.sent if s[0] == "b"] == [("b", "j", 0), ("b", "j", 1)]  # once
    began = time.monotonic()
    joiner.start(new, 5, revised=after(1.0, without_a))
    assert time.monotonic() - began < 10.0
    honest = b.worker.module.state_dict()
    assert all(torch.equal(v, honest[k]) for k, v in joiner.worker.module.state_dict().items())


def test_a_joiner_whose_state_does_not_come_gives_the_placement_up_holding_no_state(caplog):
    """Without a re-plan, the two veterans' disagreement (or silence) ends the wait: `JoinAbandoned`, which the peer
    answers by leaving the placement and joining again, not by exiting. It keeps no session: it holds no state."""
    wire = Wire()
    a, b, old, new = veterans_a_and_b(wire, lambda h, t: t + 1.0 if h.microbatch == 0 else t)
    joiner = keeper("j", wire, state_timeout=1.5)
    for k in (a, b):
        k.equip(new, old, 5)
    with pytest.raises(JoinAbandoned, match="did not come") as abandoned, caplog.at_level(logging.WARNING):
        joiner.start(new, 5)
    assert abandoned.value.revised is False and joiner.worker is None
    events = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert not any(e["event"] == "stage_loaded" for e in events)


@pytest.mark.parametrize("elsewhere", [{"h": 0, "a": 1, "b": 1, "j": 2, "x": 2}, {"h": 0, "a": 1, "b": 1, "x": 2}])
def test_a_replan_that_places_the_joiner_otherwise_ends_its_wait_at_once(elsewhere):
    joiner = keeper("j", Wire(), state_timeout=30.0)
    began = time.monotonic()
    with pytest.raises(JoinAbandoned, match="places this peer otherwise") as abandoned:
        joiner.start(two_veterans(2), 5, revised=after(0.5, two_veterans(3, elsewhere)))
    assert abandoned.value.revised is True and time.monotonic() - began < 10.0


def test_a_replan_from_a_later_iteration_does_not_change_whom_the_joiner_hears():
    """An epoch that starts after the joiner's first iteration plans beyond it: the joiner still needs the state its
    own epoch's veterans agree on, so b alone is not enough."""
    wire = Wire()
    _, b, old, new = veterans_a_and_b(wire)
    joiner = keeper("j", wire, state_timeout=1.5)
    b.equip(new, old, 5)
    later = two_veterans(3, {"h": 0, "b": 1, "j": 1, "x": 2})
    later.meta["start_iteration"] = 6
    with pytest.raises(JoinAbandoned, match="did not come"):
        joiner.start(new, 5, revised=after(0.2, later))
