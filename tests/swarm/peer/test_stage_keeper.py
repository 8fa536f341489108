"""StageKeeper refuses, on joining, a peer that cannot compute as the run does (not later, once placed); a peer
moved to another stage stops waiting for its source's state once the scheduler declared that source gone."""

from __future__ import annotations

import time

import pytest

from scheduler.path_rules import PathRules
from scheduler.schedule import Route, Schedule
from swarm.events import EVENT_ATTR
from swarm.peer.mailbox import Inbox, Outbox
from swarm.peer.members import NotAdmitted
from swarm.peer.options import PeerOptions
from swarm.peer.stage_keeper import PrecisionRefused, StageKeeper
from swarm.peer.timeline import Timeline
from swarm.run_config import RunConfig


def keeper(precision: str, *, device: str = "cpu", asked: str = "auto", gone=frozenset) -> StageKeeper:
    config = RunConfig.from_tables({"train": {"precision": precision}}, run_id="r", stages=3, skip=0.0)
    inbox = Inbox()
    options = PeerOptions(initial_peers=(), identity_path="", run_id="r", device=device, precision=asked)
    return StageKeeper("me", options, config, config.model_config(64), inbox=inbox,
                       outbox=Outbox(lambda: None, inbox, Timeline(None, peer="me")), dht=lambda: None,
                       loss_seconds=0.0, gone=gone)


def full_pipeline(placement: dict[str, int], epoch: int) -> Schedule:
    holders = [p for p, st in placement.items() if st == 0]
    return Schedule(epoch=epoch, rules=PathRules(num_stages=3, stages_per_path=3, max_swaps=0, max_swap_distance=0),
                    placement=placement, memory=dict.fromkeys(placement, 2), run_id="r",
                    routes=tuple(Route(microbatch=i, origin=h, stages=(1, 2), peers=("a1", "a2"))
                                 for i, h in enumerate(holders)))


@pytest.mark.parametrize(("run", "asked", "message"), [
    ("bf16", "auto", "needs a CUDA GPU"),
    ("fp32", "fp16", "needs a run whose train.precision is fp16"),
])
def test_a_peer_that_cannot_compute_as_the_run_does_is_refused_on_joining(run, asked, message):
    with pytest.raises(PrecisionRefused, match=message) as refused:
        keeper(run, asked=asked)
    assert isinstance(refused.value, NotAdmitted)  # `skippipe-peer join` says it in one line and exits 2
    assert str(refused.value).startswith("this peer cannot compute as the run does")


def test_a_cpu_peer_computes_in_fp32_in_an_auto_or_fp32_run():
    assert keeper("auto").precision == "fp32" and keeper("fp32").precision == "fp32"


def test_a_moved_peer_stops_waiting_for_the_state_of_a_source_declared_gone(caplog):
    """The scheduler moved this peer from stage 2 to stage 0 to take the state of `src`, which died before sending
    it: once `src` is declared gone the peer restarts the stage from its own blocks, rather than waiting out the
    hand-over's 60 s with its new stage short of a member (one such wait made an iteration take 49 s)."""
    gone: set[str] = set()
    k = keeper("fp32", gone=lambda: gone)
    k.start(full_pipeline({"src": 0, "h": 0, "a1": 1, "a2": 2, "me": 2}, epoch=0), 0)
    moved = full_pipeline({"src": 0, "h": 0, "a1": 1, "a2": 2, "me": 0}, epoch=1)
    gone.add("src")
    began = time.monotonic()
    with caplog.at_level("WARNING", logger="swarm.peer.stage_keeper"):
        k.move(moved, "src")
    assert time.monotonic() - began < 5.0
    assert k.stage == 0 and k.worker.stage == 0
    (loaded,) = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)]
    assert loaded["event"] == "stage_loaded" and loaded["source"] == "own_blocks"
    assert "declared gone" in caplog.records[-1].getMessage()
    k.close()
