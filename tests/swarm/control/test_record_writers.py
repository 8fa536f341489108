"""Who may store a run's records in the DHT: its coordinator and those its admission mode admits, checked as far as
the node knows the run (a node without the token can only check a proof's shape)."""

from __future__ import annotations

import pytest

from swarm.control.membership import token_proof
from swarm.control.record_writers import RecordWriters
from swarm.wire import RunSpec

RUN = "writers"
TOKEN = "the-runs-join-token-0123456789"


def test_a_token_run_stores_the_coordinator_and_holders_of_the_token_only():
    writers = RecordWriters(RUN, "QmCoordinator", "token", token=TOKEN)
    assert writers.refusal("QmCoordinator", b"") is None
    assert writers.refusal("QmMember", token_proof(TOKEN, "QmMember", RUN)) is None
    assert "no join token" in writers.refusal("QmStranger", b"")
    assert "not this run's" in writers.refusal("QmStranger", token_proof("other-token-0123456789", "QmStranger", RUN))
    assert "not this run's" in writers.refusal("QmThief", token_proof(TOKEN, "QmMember", RUN))  # bound to its peer
    assert "not this run's" in writers.refusal("QmMember", token_proof(TOKEN, "QmMember", "another-run"))


def test_a_node_without_the_token_checks_the_proofs_shape_only():
    writers = RecordWriters(RUN, "QmCoordinator", "token")
    assert writers.refusal("QmMember", token_proof(TOKEN, "QmMember", RUN)) is None
    assert "malformed" in writers.refusal("QmStranger", b"x" * 64)
    assert "no join token" in writers.refusal("QmStranger", b"")


def test_allow_lists_and_open_runs():
    allow = RecordWriters(RUN, "QmCoordinator", "allow", frozenset({"QmFriend"}))
    assert allow.refusal("QmFriend", b"") is None and allow.refusal("QmCoordinator", b"") is None
    assert "allow list" in allow.refusal("QmStranger", token_proof(TOKEN, "QmStranger", RUN))
    with_token = RecordWriters(RUN, "QmCoordinator", "allow", frozenset({"QmFriend"}), TOKEN)
    assert "allow list" in with_token.refusal("QmHolder", token_proof(TOKEN, "QmHolder", RUN))  # as every node does
    assert RecordWriters(RUN, "QmCoordinator", "open").refusal("QmAnyone", b"") is None


def test_the_writers_of_a_run_spec():
    spec = RunSpec(run_id=RUN, model={}, stages=2, skip_ratio=0.0, hyperparameters={}, data={},
                   coordinator="QmCoordinator", admission="allow", allowed=("QmFriend",))
    assert RecordWriters.of(spec, None) == RecordWriters(RUN, "QmCoordinator", "allow", frozenset({"QmFriend"}))
    with pytest.raises(ValueError, match="admission mode"):
        RecordWriters(RUN, "QmCoordinator", "friends")
