"""The scheduler's admission desk: it admits on a valid proof, refuses otherwise, and plans with members only."""

from __future__ import annotations

import dataclasses

import pytest

from swarm.control.membership import AdmissionPolicy, MembershipCert, token_proof
from swarm.control.messages import Admitted, Refused
from swarm.coordinator.admission_desk import ANNOUNCE_AGAIN, AdmissionDesk
from swarm.net.identity import ensure_identity, load_identity
from swarm.wire import PeerRecord, PeerState

TOKEN = "a-join-token-of-the-run-0123456789"
RUN = "desk"


@pytest.fixture(scope="module")
def scheduler_key(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("scheduler") / "identity.key")
    ensure_identity(path)
    return load_identity(path)


def record(peer: str, **kwargs) -> tuple[PeerRecord, float]:
    return PeerRecord(peer_id=peer, stage=-1, seconds_per_layer=0.1, memory_slots=2, state=PeerState.JOINING,
                      **kwargs), 0.5


def test_joiners_are_admitted_or_refused_and_only_members_are_planned_with(scheduler_key):
    desk = AdmissionDesk(AdmissionPolicy("token", TOKEN), scheduler_key, RUN, exempt={"QmCoordinator"},
                         lifetime=100.0)
    records = {"QmCoordinator": record("QmCoordinator"),
               "QmHonest": record("QmHonest", admission=token_proof(TOKEN, "QmHonest", RUN)),
               "QmThief": record("QmThief", admission=token_proof(TOKEN, "QmHonest", RUN)),  # a copied proof
               "QmNobody": record("QmNobody")}
    members, said = desk.sort(records, now=1000.0)
    assert set(members) == {"QmCoordinator"}  # nobody is a member before its record carries a certificate
    admitted = {m.peer: m for m in said if isinstance(m, Admitted)}
    refused = {m.peer: m.why for m in said if isinstance(m, Refused)}
    assert set(admitted) == {"QmHonest"} and set(refused) == {"QmThief", "QmNobody"}
    assert desk.sort(records, now=1001.0)[1] == []  # not repeated every tick...
    assert len(desk.sort(records, now=1000.0 + ANNOUNCE_AGAIN)[1]) == 3  # ...but again a while later

    cert = admitted["QmHonest"].cert
    records["QmHonest"] = record("QmHonest", cert=cert)
    records["QmThief"] = record("QmThief", cert=cert)  # someone else's certificate
    members, _ = desk.sort(records, now=1020.0)
    assert set(members) == {"QmCoordinator", "QmHonest"}
    # renewed once a third of its life is left, as long as the peer beats
    renewed = [m for m in desk.sort(records, now=1075.0)[1] if isinstance(m, Admitted) and m.peer == "QmHonest"]
    assert MembershipCert.from_msgpack(renewed[0].cert).expires == 1175.0
    # expired: not a member any more until it is admitted again
    assert "QmHonest" not in desk.sort(records, now=1101.0)[0]


def test_certificates_of_another_issuer_are_not_taken(scheduler_key, tmp_path):
    path = str(tmp_path / "mallory.key")
    ensure_identity(path)
    forged = MembershipCert.issue(load_identity(path), "QmMallory", RUN, 10**6).to_msgpack()
    desk = AdmissionDesk(AdmissionPolicy("allow", None, frozenset({"QmFriend"})), scheduler_key, RUN)
    members, said = desk.sort({"QmMallory": record("QmMallory", cert=forged)}, now=1000.0)
    assert members == {} and [type(m) for m in said] == [Refused]
    members, said = desk.sort({"QmFriend": record("QmFriend")}, now=1000.0)
    assert [m.peer for m in said if isinstance(m, Admitted)] == ["QmFriend"]
    assert dataclasses.replace(record("QmFriend")[0]).cert == b""


def test_an_evicted_peer_is_never_a_member_again(scheduler_key):
    banned: set[str] = set()
    desk = AdmissionDesk(AdmissionPolicy("open"), scheduler_key, RUN, banned=banned)
    members, said = desk.sort({"QmPeer": record("QmPeer")}, now=1000.0)
    cert = next(m.cert for m in said if isinstance(m, Admitted))
    assert "QmPeer" in desk.sort({"QmPeer": record("QmPeer", cert=cert)}, now=1001.0)[0]
    banned.add("QmPeer")  # the scheduler evicted it
    members, said = desk.sort({"QmPeer": record("QmPeer", cert=cert)}, now=1020.0)
    assert members == {} and [m.why for m in said if isinstance(m, Refused)] == ["it was evicted from the run"]


def test_a_joiner_the_policy_refuses_hears_why_from_its_join_alone(scheduler_key):
    """The DHT refuses the record of a joiner without a valid proof (`RecordWriters`), so its `Join` is where the
    desk answers it; an admissible joiner's `Join` is left to its record, which brings the certificate."""
    desk = AdmissionDesk(AdmissionPolicy("token", TOKEN), scheduler_key, RUN, exempt={"QmCoordinator"})
    refused = desk.answer_join("QmWrong", token_proof("another-runs-token-0123456789", "QmWrong", RUN), 1000.0)
    assert refused == Refused(peer="QmWrong", why="its join token is not this run's")
    assert "--token" in desk.answer_join("QmNoToken", b"", 1000.0).why
    assert desk.answer_join("QmWrong", b"", 1001.0) is None  # answered lately: not again at every Join
    assert desk.answer_join("QmWrong", b"", 1000.0 + ANNOUNCE_AGAIN) is not None
    assert desk.answer_join("QmHonest", token_proof(TOKEN, "QmHonest", RUN), 1000.0) is None
    assert desk.answer_join("QmCoordinator", b"", 1000.0) is None
