"""Lineage: which averaging rounds a stage copy's state went through, so that copies that drifted apart are found.

The members of a stage group hold bit-identical state only while every member averages over the same
contributions. A member that dies mid-round breaks that without anyone seeing it: its gradients reach some members
whole and others cut off, the first average with them and the others without, and from then on the copies differ
for good (the group's averages install the same mean on different weights). A joiner then hears no two veterans
agree on the stage's state.

Each copy therefore carries a lineage: a hash chained over the rounds it stepped with (the round's iteration and
its contributors with their weights). Members send theirs with their gradients (`HopHeader.lineage`), so every
member of a round sees every other's, and all of them reach the same verdict (`judge`): the lineage most members
hold is the group's, ties going to the group with the smallest peer id, and the members holding another one are
strays that take the state of the holders (`swarm.stage_group.mending`). A copy whose lineage is unknown (empty: a
new session, a joiner) has no vote and takes the group's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

LINEAGE_BYTES = 16
"""Size of a lineage (a BLAKE2b digest); the empty lineage means unknown."""


def next_lineage(base: bytes, iteration: int, contributors: Mapping[str, int]) -> bytes:
    """The lineage of a copy that was at `base` and stepped with the round of `iteration` over `contributors`
    (member -> the weight its contribution claimed). Equal inputs give equal lineages on every member. A contribution
    of no weight (a member the iteration's paths did not visit) moves no mean, so whether it came changes nothing."""
    h = hashlib.blake2b(base, digest_size=LINEAGE_BYTES)
    h.update(int(iteration).to_bytes(8, "little"))
    for peer in sorted(p for p, weight in contributors.items() if weight):
        h.update(peer.encode() + b"\0" + int(contributors[peer]).to_bytes(8, "little"))
    return h.digest()


@dataclass(frozen=True)
class Verdict:
    """What a round's lineages say: the group's lineage, the members holding it, and the strays (members whose
    copy went another way). With no voter at all, `lineage` is empty and nobody strays."""

    lineage: bytes
    holders: tuple[str, ...]
    strays: tuple[str, ...]


def judge(lineages: Mapping[str, bytes]) -> Verdict:
    """The verdict on the lineages the members of a round came with (member -> lineage, empty = no vote): the same
    on every member that heard the same members."""
    groups: dict[bytes, list[str]] = {}
    for peer, lineage in lineages.items():
        if lineage:
            groups.setdefault(lineage, []).append(peer)
    if not groups:
        return Verdict(b"", (), ())
    lineage = min(groups, key=lambda g: (-len(groups[g]), min(groups[g])))
    strays = sorted(p for g, members in groups.items() if g != lineage for p in members)
    return Verdict(lineage, tuple(sorted(groups[lineage])), tuple(strays))


def chain(mine: bytes, verdict: Verdict, mended: bool | None, iteration: int,
          contributors: Mapping[str, int]) -> bytes:
    """This copy's lineage after the round of `iteration`, given the one it came with (`mine`) and the round's
    verdict: a holder, a copy with no lineage yet and a stray that took the holders' state (`mended`) go on from the
    group's lineage; a stray not mended goes on from its own, so that the next round finds it again."""
    base = verdict.lineage if verdict.lineage and (not mine or mine == verdict.lineage or mended) else mine
    return next_lineage(base, iteration, contributors)
