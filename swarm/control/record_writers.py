"""`RecordWriters`: who may store a run's records in the DHT, so that strangers' records are refused by every
honest node before they are stored.

Every DHT read of a run's key returns the whole dictionary of records under it (one per signer), and hivemind
refuses a reply over 4 MiB. A stranger who could store a self-signed record under a run's key could therefore spoil
every read of it with throw-away identities: 48 peer records of ~100 KiB (the largest the schema allows) cut a
read to 42 records of 49, and 120 emptied every read of the peers' key (the scheduler would have seen nobody and
taken every peer for gone). So a node that knows the run stores and relays only the records of those the run
admits:

- the coordinator (the run spec's signer);
- in a token run, the holders of the join token: a record's envelope carries its author's proof
  (`token_proof`, an HMAC bound to the author's peer id), checked by every node that holds the token; a node
  without it (an onlooker) can only check the proof's shape;
- in an allow-listed run, the listed peer ids (a token is no use there: the listed peers have none to check it);
- in an open run, anyone: an open run reachable from the internet stays exposed to such a flood.

A member who holds the token can still make identities of its own: the token admits whoever holds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from swarm.control.membership import AdmissionPolicy
from swarm.wire import RunSpec

PROOF_SHAPE = re.compile(rb"[0-9a-f]{64}")
"""What a proof looks like (hex HMAC-SHA256): all a node without the token can check."""


@dataclass(frozen=True)
class RecordWriters:
    """Whose records of run `run` a DHT node stores: its `coordinator`, and those its admission `mode` admits
    ("token": holders of the join token, checked against `token` where this node has it; "allow": the peer ids in
    `allowed`; "open": anyone). The rules are `AdmissionPolicy`'s, plus two: the coordinator is always a writer,
    and a node without the token checks only the proof's shape."""

    run: str
    coordinator: str
    mode: str = "token"
    allowed: frozenset[str] = frozenset()
    token: str | None = None
    policy: AdmissionPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", AdmissionPolicy(self.mode, self.token, self.allowed))  # checks the mode

    @classmethod
    def of(cls, spec: RunSpec, token: str | None) -> RecordWriters:
        """The writers of the run `spec` describes, as seen by a node holding `token` (None: no token)."""
        return cls(spec.run_id, spec.coordinator, spec.admission, frozenset(spec.allowed), token)

    def refusal(self, signer: str, proof: bytes) -> str | None:
        """Why a record signed by `signer` carrying `proof` is not stored (None: it is)."""
        if signer == self.coordinator:
            return None
        if self.mode == "token" and self.token is None and proof:
            return None if PROOF_SHAPE.fullmatch(proof) else "its proof of the join token is malformed"
        return self.policy.refusal(signer, self.run, proof)
