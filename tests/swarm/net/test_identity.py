"""The key file: created once, the same peer id for hivemind and py-libp2p, signatures hivemind can verify."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swarm.net.identity import (
    IdentityError,
    created_here,
    ensure_identity,
    load_identity,
    peer_id_from_public_key,
    verify,
    verify_from,
)


def test_created_once_and_stable(tmp_path):
    path = str(tmp_path / "sub" / "identity.key")
    pid = ensure_identity(path)
    assert pid.startswith("Qm") and ensure_identity(path) == pid == load_identity(path).peer_id
    assert (tmp_path / "sub" / "identity.key").stat().st_mode & 0o777 == 0o600


def test_only_a_key_this_process_wrote_counts_as_fresh(tmp_path):
    """A fresh key skips hivemind's check that no running peer holds it; a key found on disk (another process's,
    or this peer's from an earlier run) does not."""
    mine, theirs = tmp_path / "mine.key", tmp_path / "theirs.key"
    subprocess.run([sys.executable, "-c", "import sys; from swarm.net.identity import ensure_identity; "
                    "ensure_identity(sys.argv[1])", str(theirs)], check=True, timeout=60)
    assert not created_here(str(mine))
    ensure_identity(str(mine))
    ensure_identity(str(theirs))
    assert created_here(str(mine)) and created_here(str(tmp_path / "." / "mine.key"))
    assert not created_here(str(theirs))


def test_same_peer_id_as_hivemind_and_libp2p(tmp_path):
    ours, theirs = str(tmp_path / "ours.key"), str(tmp_path / "theirs.key")
    pid = ensure_identity(ours)
    # hivemind and libp2p cannot share a process, so each one reads the files in its own interpreter
    hivemind_ids = subprocess.run(
        [sys.executable, "-c", "import sys; from hivemind.p2p import P2P, PeerID; P2P.generate_identity(sys.argv[2]);"
         "print(*[PeerID.from_identity(open(p, 'rb').read()).to_base58() for p in sys.argv[1:]])", ours, theirs],
        capture_output=True, text=True, timeout=60, check=True).stdout.split()
    libp2p_ids = subprocess.run(
        [sys.executable, "-c", "import sys; from libp2p.crypto.serialization import deserialize_private_key as d;"
         "from libp2p.peer.id import ID; print(*[ID.from_pubkey(d(open(p, 'rb').read()).get_public_key())"
         ".to_base58() for p in sys.argv[1:]])", ours, theirs],
        capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert hivemind_ids == libp2p_ids == [pid, ensure_identity(theirs)]


def test_sign_and_verify(tmp_path):
    from hivemind.utils.crypto import RSAPublicKey

    me = load_identity(str(tmp_path / "a.key")) if ensure_identity(str(tmp_path / "a.key")) else None
    other = load_identity(str(tmp_path / "b.key")) if ensure_identity(str(tmp_path / "b.key")) else None
    sig = me.sign(b"record")
    assert verify(me.public_key, b"record", sig) and RSAPublicKey.from_bytes(me.public_key).verify(b"record", sig)
    assert not verify(me.public_key, b"recorD", sig) and not verify(other.public_key, b"record", sig)
    assert verify_from(me.peer_id, me.public_key, b"record", sig)
    assert not verify_from(other.peer_id, me.public_key, b"record", sig)
    for junk in (b"", b"ssh-rsa AAAA", b"\x00" * 10_000):
        assert not verify(junk, b"record", sig)
        with pytest.raises(IdentityError):
            peer_id_from_public_key(junk)
    assert not verify(me.public_key, b"record", b"not base64!")


def test_bad_key_files_refused(tmp_path):
    for name, blob in {"empty": b"", "garbage": b"\xff" * 40, "ed25519": b"\x08\x01\x12\x02ab"}.items():
        path = tmp_path / name
        path.write_bytes(blob)
        with pytest.raises(IdentityError):
            load_identity(str(path))
