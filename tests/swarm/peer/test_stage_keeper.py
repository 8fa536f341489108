"""StageKeeper refuses, on joining, a peer that cannot compute as the run does (not later, once placed)."""

from __future__ import annotations

import pytest

from swarm.peer.mailbox import Inbox, Outbox
from swarm.peer.members import NotAdmitted
from swarm.peer.options import PeerOptions
from swarm.peer.stage_keeper import PrecisionRefused, StageKeeper
from swarm.peer.timeline import Timeline
from swarm.run_config import RunConfig


def keeper(precision: str, *, device: str = "cpu", asked: str = "auto") -> StageKeeper:
    config = RunConfig.from_tables({"train": {"precision": precision}}, run_id="r", stages=3, skip=0.0)
    inbox = Inbox()
    options = PeerOptions(initial_peers=(), identity_path="", run_id="r", device=device, precision=asked)
    return StageKeeper("me", options, config, config.model_config(64), inbox=inbox,
                       outbox=Outbox(lambda: None, inbox, Timeline(None, peer="me")), dht=lambda: None,
                       loss_seconds=0.0)


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
