"""Who belongs to a run: the join token's proof, the admission policy, and signed membership certificates.

A joiner proves it holds the run's join token without sending it: its peer record carries
``HMAC-SHA256(token, "skippipe-join/{run}/{peer}")``, bound to its own peer id (a copied proof is worth nothing
to another key). The scheduler checks the proof against its `AdmissionPolicy` (or the spec's allow list, or an
open run), and admits the peer with a `MembershipCert`: the peer id, the run, an expiry, signed by the scheduler.
Every peer then takes records, streams, gossip and averaging input only from peers holding a valid certificate
of a trusted issuer (the coordinator, or a successor it named); the scheduler renews the certificates of the peers
that still beat.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection
from dataclasses import dataclass

from scheduler.constants import MAX_PEERS
from swarm.constants import MAX_CERT_BYTES, MAX_ID_CHARS, WIRE_VERSION
from swarm.net.identity import Identity, looks_like_peer_id, verify_from
from swarm.wire import (
    ADMISSION_MODES,
    WireError,
    pack,
    read_bytes,
    read_float,
    read_map,
    read_str,
    read_version,
    unpack,
)

MAX_ALLOW_FILE_BYTES = 1 << 20
TOKEN_BYTES = 24
"""Random bytes of a generated join token (before url-safe base64)."""
MAX_TOKEN_CHARS = 256


def token_proof(token: str, peer: str, run: str) -> bytes:
    """What a holder of `token` puts in its peer record to be admitted to `run` as `peer` (hex HMAC-SHA256)."""
    return hmac.new(token.encode(), f"skippipe-join/{run}/{peer}".encode(), hashlib.sha256).hexdigest().encode()


def read_allow_file(path: str) -> tuple[str, ...]:
    """The peer ids listed in file `path` (one a line; blank lines and ``#`` comments ignored). Raises ValueError
    naming the first line that is not a peer id."""
    with open(path, encoding="utf-8") as f:
        text = f.read(MAX_ALLOW_FILE_BYTES + 1)
    if len(text) > MAX_ALLOW_FILE_BYTES:
        raise ValueError(f"larger than {MAX_ALLOW_FILE_BYTES} bytes")
    peers = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            if not looks_like_peer_id(line):
                raise ValueError(f"line {number}: {line[:60]!r} is not a peer id")
            peers.append(line)
    if not peers or len(peers) > MAX_PEERS:
        raise ValueError(f"lists {len(peers)} peer ids; 1 to {MAX_PEERS} are needed")
    return tuple(dict.fromkeys(peers))


def check_token(token: str) -> str:
    """`token` if it can be a join token; raises ValueError saying why not (it comes from a command line)."""
    if not 16 <= len(token) <= MAX_TOKEN_CHARS or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError(f"a join token is 16-{MAX_TOKEN_CHARS} printable ASCII characters without spaces")
    return token


@dataclass(frozen=True)
class AdmissionPolicy:
    """Whom a scheduler admits. `mode` is "token" (holders of `token`), "allow" (the peer ids in `allowed` only:
    every node of the run must agree on whose records it stores, and an allow-listed peer has no token to check a
    proof with) or "open" (anyone: say so loudly)."""

    mode: str = "token"
    token: str | None = None
    allowed: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.mode not in ADMISSION_MODES:
            raise ValueError(f"admission mode must be one of {', '.join(ADMISSION_MODES)}, got {self.mode!r}")

    def refusal(self, peer: str, run: str, proof: bytes) -> str | None:
        """Why `peer` is not admitted to `run` with `proof` (None when it is)."""
        if self.mode == "open" or (self.mode == "allow" and peer in self.allowed):
            return None
        if self.mode == "allow":
            return "it is not on the run's allow list"
        if self.token and proof and hmac.compare_digest(proof, token_proof(self.token, peer, run)):
            return None
        if not proof:
            return "it presented no join token (start it with --token)"
        if not self.token:
            return "this scheduler does not hold the run's join token"
        return "its join token is not this run's"


@dataclass(frozen=True)
class MembershipCert:
    """`issuer` admits `peer` to `run` until `expires` (``hivemind.get_dht_time()`` clock)."""

    peer: str
    run: str
    expires: float
    issuer: str
    public_key: bytes
    """The issuer's RSA public key (OpenSSH form); its peer id must be `issuer`."""
    signature: bytes

    @staticmethod
    def signed_bytes(peer: str, run: str, expires: float, issuer: str) -> bytes:
        return pack(["skippipe.cert", run, peer, float(expires), issuer])

    @classmethod
    def issue(cls, identity: Identity, peer: str, run: str, expires: float) -> MembershipCert:
        signature = identity.sign(cls.signed_bytes(peer, run, expires, identity.peer_id))
        return cls(peer=peer, run=run, expires=expires, issuer=identity.peer_id, public_key=identity.public_key,
                   signature=signature)

    def to_msgpack(self) -> bytes:
        return pack({"version": WIRE_VERSION, "peer": self.peer, "run": self.run, "expires": self.expires,
                     "issuer": self.issuer, "key": self.public_key, "sig": self.signature})

    @classmethod
    def from_msgpack(cls, data: bytes) -> MembershipCert:
        d = read_map(unpack(data, max_bytes=MAX_CERT_BYTES), "cert")
        read_version(d, "cert")
        return cls(peer=read_str(d.get("peer"), "cert.peer"), run=read_str(d.get("run"), "cert.run"),
                   expires=read_float(d.get("expires"), "cert.expires", 0.0),
                   issuer=read_str(d.get("issuer"), "cert.issuer", MAX_ID_CHARS),
                   public_key=read_bytes(d.get("key"), "cert.key", MAX_CERT_BYTES),
                   signature=read_bytes(d.get("sig"), "cert.sig", MAX_CERT_BYTES))


def cert_problem(raw: bytes, *, peer: str, run: str, issuers: Collection[str], now: float) -> str | None:
    """Why `raw` is not a valid certificate of `peer` in `run` from one of `issuers` at `now` (None if it is)."""
    if not raw:
        return "no membership certificate"
    try:
        cert = MembershipCert.from_msgpack(raw)
    except WireError as e:
        return f"malformed membership certificate: {e}"
    if cert.peer != peer or cert.run != run:
        return f"a certificate of {cert.peer} in run {cert.run!r}"
    if cert.issuer not in issuers:
        return f"certificate issued by {cert.issuer}, who does not admit peers to this run"
    if cert.expires <= now:
        return "membership certificate expired"
    if not verify_from(cert.issuer, cert.public_key, MembershipCert.signed_bytes(peer, run, cert.expires,
                                                                                 cert.issuer), cert.signature):
        return "membership certificate with a bad signature"
    return None
