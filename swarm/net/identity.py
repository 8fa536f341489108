"""One RSA key per peer, kept in a file: the same peer id in hivemind's p2pd and in the py-libp2p sidecar.

The file holds libp2p's protobuf ``crypto.pb.PrivateKey`` (key type RSA, PKCS#1 DER), exactly what hivemind's
``P2P.generate_identity`` writes: pass it to ``hivemind.P2P.create(identity_path=...)`` / ``hivemind.DHT(...,
identity_path=...)`` and load it in the sidecar with ``libp2p.crypto.serialization.deserialize_private_key``.

This module imports neither hivemind nor libp2p (they cannot share a process), only ``cryptography``, so both
the peer process and the gossip sidecar may import it. Signatures use the same scheme as hivemind's
``RSAPrivateKey.sign`` (RSA-PSS, MGF1-SHA256, max salt, SHA-256, base64), so hivemind's ``RSAPublicKey``
verifies them; public keys travel in OpenSSH form, like hivemind's ``RSAPublicKey.to_bytes``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
from dataclasses import dataclass

from cryptography import exceptions
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

logger = logging.getLogger(__name__)

_KEY_TYPE_RSA = 0
_RSA_KEY_BITS = 2048
MIN_RSA_BITS, MAX_RSA_BITS, RSA_EXPONENT = 2048, 4096, 65537
"""The only RSA keys accepted: weaker ones are forgeable, larger moduli or exponents make every verification slow
(a public exponent of 2^1000 costs ~50x the work of 65537), which a stranger could use to stall a reader."""
_MAX_KEY_FILE_BYTES = 16 * 1024
_MAX_PUBLIC_KEY_BYTES = 4096
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_CHARS = frozenset(_B58_ALPHABET)


class IdentityError(ValueError):
    """A key file, public key or peer id that cannot be used."""


@dataclass(frozen=True)
class Identity:
    """A peer's private key and the ids derived from it.

    :param path: the key file it was loaded from
    :param peer_id: the libp2p peer id, base58 (``Qm...``), equal to hivemind's ``PeerID.to_base58()``
    """

    path: str
    peer_id: str
    _key: rsa.RSAPrivateKey

    @property
    def public_key(self) -> bytes:
        """The public key in OpenSSH form (what :func:`verify` and hivemind's ``RSAPublicKey.from_bytes`` take)."""
        return self._key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)

    def sign(self, data: bytes) -> bytes:
        """Sign ``data``; returns a base64 signature, verifiable with :func:`verify` or hivemind's RSAPublicKey."""
        return base64.b64encode(self._key.sign(data, _PSS, hashes.SHA256()))


_CREATED_HERE: set[str] = set()
"""Absolute paths of the key files this process created (`ensure_identity` won the race to write them)."""


def ensure_identity(path: str) -> str:
    """Create the key file at ``path`` if it does not exist yet; return the peer id (base58).

    The file is written atomically with mode 0600, so two processes racing on first run both end up with one key.
    """
    if not os.path.exists(path):
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        key = rsa.generate_private_key(public_exponent=65537, key_size=_RSA_KEY_BITS)
        der = key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_encode_key_proto(_KEY_TYPE_RSA, der))
        try:
            os.link(tmp, path)  # fails if another process won the race: keep theirs
            _CREATED_HERE.add(os.path.abspath(path))
            logger.info("created a new peer identity in %s", path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return load_identity(path).peer_id


def created_here(path: str) -> bool:
    """Whether this process created the key file at ``path`` (a fresh key: no other process can hold it yet).

    A key that is not fresh may be one a running peer uses; hivemind's check for that starts a p2p daemon of its
    own and bootstraps it to look the id up, which a fresh key does not need (hivemind skips it for the keys it
    generates itself)."""
    return os.path.abspath(path) in _CREATED_HERE


def load_identity(path: str) -> Identity:
    """Load the key file at ``path``; raises :class:`IdentityError` if it is not an RSA key in libp2p's format."""
    with open(path, "rb") as f:
        blob = f.read(_MAX_KEY_FILE_BYTES + 1)
    if len(blob) > _MAX_KEY_FILE_BYTES:
        raise IdentityError(f"{path}: key file is larger than {_MAX_KEY_FILE_BYTES} bytes")
    key_type, der = _decode_key_proto(blob, path)
    if key_type != _KEY_TYPE_RSA:
        raise IdentityError(f"{path}: key type {key_type} is not RSA ({_KEY_TYPE_RSA})")
    try:
        key = serialization.load_der_private_key(der, password=None)
    except ValueError as e:
        raise IdentityError(f"{path}: not a DER private key: {e}") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise IdentityError(f"{path}: not an RSA private key")
    try:
        check_key_strength(key.public_key())
    except IdentityError as e:
        raise IdentityError(f"{path}: {e}") from None
    return Identity(path=path, peer_id=_peer_id_of(key.public_key()), _key=key)


def looks_like_peer_id(text: str) -> bool:
    """Whether `text` could be a peer id (base58, 1 to 128 characters); says nothing of whether it exists."""
    return 0 < len(text) <= 128 and set(text) <= _B58_CHARS


def peer_id_from_public_key(public_key: bytes) -> str:
    """The base58 peer id that owns ``public_key`` (OpenSSH form); raises :class:`IdentityError` if malformed."""
    return _peer_id_of(_load_public_key(public_key))


def verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """True iff ``signature`` (base64) is a valid signature of ``data`` by ``public_key`` (OpenSSH form).

    Never raises on malformed input from the network: a bad key or signature is simply not valid.
    """
    try:
        key = _load_public_key(public_key)
        key.verify(base64.b64decode(signature, validate=True), data, _PSS, hashes.SHA256())
        return True
    except (IdentityError, ValueError, TypeError, binascii.Error, exceptions.InvalidSignature):
        return False


def verify_from(peer_id: str, public_key: bytes, data: bytes, signature: bytes) -> bool:
    """True iff ``public_key`` belongs to ``peer_id`` and signed ``data``: binds a record to the peer it claims."""
    try:
        return peer_id_from_public_key(public_key) == peer_id and verify(public_key, data, signature)
    except IdentityError:
        return False


def _load_public_key(public_key: bytes) -> rsa.RSAPublicKey:
    if not isinstance(public_key, bytes) or len(public_key) > _MAX_PUBLIC_KEY_BYTES:
        raise IdentityError(f"public key must be bytes, at most {_MAX_PUBLIC_KEY_BYTES} of them")
    try:
        key = serialization.load_ssh_public_key(public_key)
    except (ValueError, exceptions.UnsupportedAlgorithm) as e:
        raise IdentityError(f"not an OpenSSH public key: {e}") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise IdentityError("not an RSA public key")
    check_key_strength(key)
    return key


def check_key_strength(key: rsa.RSAPublicKey) -> None:
    """Raise :class:`IdentityError` unless `key` has MIN_RSA_BITS..MAX_RSA_BITS bits and exponent RSA_EXPONENT."""
    if not MIN_RSA_BITS <= key.key_size <= MAX_RSA_BITS:
        raise IdentityError(f"RSA key of {key.key_size} bits; only {MIN_RSA_BITS} to {MAX_RSA_BITS} are accepted")
    if key.public_numbers().e != RSA_EXPONENT:
        raise IdentityError(f"RSA public exponent must be {RSA_EXPONENT}")


def _peer_id_of(public_key: rsa.RSAPublicKey) -> str:
    # libp2p peer id spec: multihash(sha2-256) of the protobuf PublicKey{RSA, SubjectPublicKeyInfo DER}
    spki = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashlib.sha256(_encode_key_proto(_KEY_TYPE_RSA, spki)).digest()
    return _b58encode(bytes([0x12, 0x20]) + digest)


def _encode_key_proto(key_type: int, data: bytes) -> bytes:
    # proto2 message {required KeyType key_type = 1; required bytes data = 2;}
    return b"\x08" + _varint(key_type) + b"\x12" + _varint(len(data)) + data


def _decode_key_proto(blob: bytes, path: str) -> tuple[int, bytes]:
    key_type, data, pos = None, None, 0
    while pos < len(blob):
        tag, pos = _read_varint(blob, pos, path)
        if tag == 0x08:
            key_type, pos = _read_varint(blob, pos, path)
        elif tag == 0x12:
            length, pos = _read_varint(blob, pos, path)
            if pos + length > len(blob):
                raise IdentityError(f"{path}: truncated key file")
            data, pos = blob[pos : pos + length], pos + length
        else:
            raise IdentityError(f"{path}: unexpected protobuf tag {tag} in key file")
    if key_type is None or data is None:
        raise IdentityError(f"{path}: key file lacks key_type or data")
    return key_type, data


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(blob: bytes, pos: int, path: str) -> tuple[int, int]:
    result = shift = 0
    while pos < len(blob) and shift < 64:
        byte = blob[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise IdentityError(f"{path}: malformed varint in key file")


def _b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58_ALPHABET[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out
