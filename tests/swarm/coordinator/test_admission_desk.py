"""The scheduler's admission desk: it admits on a valid proof, refuses otherwise, and plans with members only."""

from __future__ import annotations

import dataclasses

import pytest

from swarm.control.membership import AdmissionPolicy, MembershipCert, token_proof
from swarm.control.messages import Admitted, Join, Refused
from swarm.coordinator.admission_desk import (
    ANNOUNCE_AGAIN,
    JOIN_FRESH,
    JOIN_REFUSAL_BURST,
    JOIN_REFUSALS_PER_SECOND,
    AdmissionDesk,
)
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
    wrong = token_proof("another-runs-token-0123456789", "QmWrong", RUN)
    refused = desk.answer_join(Join(peer="QmWrong", admission=wrong, sent=999.0), 1000.0)
    assert refused == Refused(peer="QmWrong", why="its join token is not this run's") and not refused.evicted
    assert "--token" in desk.answer_join(Join(peer="QmNoToken", sent=1000.0), 1000.0).why
    assert desk.answer_join(Join(peer="QmWrong", sent=1001.0), 1001.0) is None  # answered lately: not at every Join
    assert desk.answer_join(Join(peer="QmWrong", sent=1010.0), 1000.0 + ANNOUNCE_AGAIN) is not None
    assert desk.answer_join(Join(peer="QmHonest", admission=token_proof(TOKEN, "QmHonest", RUN), sent=1000.0),
                            1000.0) is None
    assert desk.answer_join(Join(peer="QmCoordinator", sent=1000.0), 1000.0) is None


def test_join_refusals_cannot_be_replayed_turned_on_members_or_flooded(scheduler_key):
    desk = AdmissionDesk(AdmissionPolicy("token", TOKEN), scheduler_key, RUN, lifetime=100.0)
    old = Join(peer="QmLate", sent=1000.0)  # a volunteer's first try, without its token
    assert desk.answer_join(dataclasses.replace(old, sent=1000.0 - JOIN_FRESH - 1), 1000.0) is None  # replayed
    assert desk.answer_join(dataclasses.replace(old, sent=1000.0 + 3600), 1000.0) is None  # from the future
    assert desk.answer_join(Join(peer="QmNoSent"), 1000.0) is None  # a Join that does not say when
    members, said = desk.sort({"QmLate": record("QmLate", admission=token_proof(TOKEN, "QmLate", RUN))}, 1000.0)
    assert [type(m) for m in said] == [Admitted]  # it came back with the token and was admitted...
    assert desk.answer_join(dataclasses.replace(old, sent=1020.0), 1020.0) is None  # ...and its certificate holds

    burst = int(JOIN_REFUSAL_BURST)
    sybils = [desk.answer_join(Join(peer=f"QmSybil{i}", sent=2000.0), 2000.0) for i in range(3 * burst)]
    assert sum(r is not None for r in sybils) == JOIN_REFUSAL_BURST  # a burst, then...
    later = [desk.answer_join(Join(peer=f"QmLater{i}", sent=2005.0), 2005.0) for i in range(20)]
    assert sum(r is not None for r in later) == 5 * JOIN_REFUSALS_PER_SECOND  # ...the steady rate
