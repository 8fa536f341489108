"""Join tokens, admission policies and membership certificates: what admits a peer and what does not."""

from __future__ import annotations

import dataclasses

import pytest

from swarm.control.membership import (
    AdmissionPolicy,
    MembershipCert,
    cert_problem,
    check_token,
    read_allow_file,
    token_proof,
)
from swarm.net.identity import ensure_identity, load_identity

TOKEN = "a-join-token-of-the-run-0123456789"


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("issuer") / "identity.key")
    ensure_identity(path)
    return load_identity(path)


def test_a_proof_admits_its_own_peer_to_its_own_run_only():
    policy = AdmissionPolicy("token", TOKEN)
    proof = token_proof(TOKEN, "QmPeer", "run")
    assert policy.refusal("QmPeer", "run", proof) is None
    assert "not this run's" in policy.refusal("QmOther", "run", proof)  # copied by another key: worthless
    assert "not this run's" in policy.refusal("QmPeer", "other-run", proof)
    assert "not this run's" in policy.refusal("QmPeer", "run", token_proof("another-token-0123456789", "QmPeer",
                                                                         "run"))
    assert "--token" in policy.refusal("QmPeer", "run", b"")
    assert TOKEN.encode() not in proof  # the token itself is never published


def test_allow_lists_and_open_runs():
    allow = AdmissionPolicy("allow", None, frozenset({"QmFriend"}))
    assert allow.refusal("QmFriend", "run", b"") is None
    assert "allow list" in allow.refusal("QmStranger", "run", token_proof(TOKEN, "QmStranger", "run"))
    with_token = AdmissionPolicy("allow", TOKEN, frozenset({"QmFriend"}))  # a successor given a token by hand
    assert "allow list" in with_token.refusal("QmHolder", "run", token_proof(TOKEN, "QmHolder", "run"))
    assert AdmissionPolicy("open").refusal("QmAnyone", "run", b"") is None
    assert "does not hold" in AdmissionPolicy("token", None).refusal("QmPeer", "run", b"proof")
    with pytest.raises(ValueError):
        AdmissionPolicy("everyone")


def test_certificates_bind_peer_run_issuer_and_expiry(issuer):
    cert = MembershipCert.issue(issuer, "QmPeer", "run", 1000.0)
    raw = cert.to_msgpack()
    ok = dict(peer="QmPeer", run="run", issuers={issuer.peer_id}, now=500.0)
    assert cert_problem(raw, **ok) is None
    assert "expired" in cert_problem(raw, **{**ok, "now": 1000.0})
    assert "a certificate of QmPeer" in cert_problem(raw, **{**ok, "peer": "QmOther"})
    assert "a certificate of QmPeer" in cert_problem(raw, **{**ok, "run": "other"})
    assert "does not admit" in cert_problem(raw, **{**ok, "issuers": {"QmSomeoneElse"}})
    longer = dataclasses.replace(cert, expires=10**9).to_msgpack()  # its holder extended it: the signature says no
    assert "bad signature" in cert_problem(longer, **ok)
    assert "malformed" in cert_problem(b"\xc1junk", **ok) and cert_problem(b"", **ok) == "no membership certificate"


def test_tokens_and_allow_files_from_the_command_line_are_checked(tmp_path):
    assert check_token(TOKEN) == TOKEN
    for bad in ("short", "has spaces in it, too many", "x" * 300, "tökén-with-non-ascii-0123"):
        with pytest.raises(ValueError):
            check_token(bad)
    good = tmp_path / "allow.txt"
    good.write_text("# volunteers\nQmFriend1\n\nQmFriend2  # the lab\nQmFriend1\n")
    assert read_allow_file(str(good)) == ("QmFriend1", "QmFriend2")
    bad = tmp_path / "bad.txt"
    bad.write_text("QmFriend1\nnot a peer id!\n")
    with pytest.raises(ValueError, match="line 2"):
        read_allow_file(str(bad))
    bad.write_text("# nobody\n")
    with pytest.raises(ValueError, match="0 peer ids"):
        read_allow_file(str(bad))
