"""Which data holder draws from which of the run's shards, epoch after epoch.

The run's corpus is cut into as many shards as the first plan had data holders. A shard stays with its holder; a
departed holder's shard goes to the drawer carrying the fewest; a new holder takes one over from a drawer carrying
several; and a shard whose holder injects nothing in the new epoch (a full pipeline's columns start at only some
holders) goes to one that does: otherwise it would never be drawn, nor would the samples an abandoned iteration
requeued into it. A holder that takes a shard over starts it at its committed position (the peer's part).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from swarm.wire import PeerRecord

ShardMove = tuple[int, str, str]
"""(shard, from holder, to holder)."""


def shard_drawers(holders: Collection[str], peers: Mapping[str, PeerRecord]) -> list[str]:
    """The data holders among `holders` that draw from the run's shards: one started with its own documents
    (`--data`) draws from them only, so the run's shards are never given to it."""
    return sorted(h for h in holders if h in peers and not peers[h].data_holder)


def assign_shards(previous: Mapping[str, Collection[int]], holders: Collection[str], drawers: Collection[str],
                  num_shards: int) -> dict[str, list[int]]:
    """Holder -> its shards: each keeps its own (`previous`); a shard without a holder goes to the drawer with the
    fewest; a drawer without a shard takes one from the drawer carrying the most, if that one has several."""
    shards = {h: list(previous.get(h, ())) for h in holders}
    owned = {k for ks in shards.values() for k in ks}
    takers = sorted(h for h in drawers if h in shards) or sorted(shards)
    for k in range(num_shards):
        if k not in owned:
            shards[min(takers, key=lambda h: (len(shards[h]), h))].append(k)
    _fill_empty(shards, takers)
    return shards


def shards_to_injectors(shards: Mapping[str, Collection[int]], injecting: Collection[str],
                        drawers: Collection[str]) -> tuple[dict[str, list[int]], list[ShardMove]]:
    """`shards` with every shard of a drawer that injects nothing moved to the injecting drawer with the fewest
    (an injecting drawer left without one then takes one from a drawer carrying several), and the moves."""
    out = {h: list(ks) for h, ks in shards.items()}
    takers = sorted(h for h in drawers if h in injecting and h in out)
    moves: list[ShardMove] = []
    if not takers:
        return out, moves
    for h in sorted(out):
        if h in injecting or h not in drawers:
            continue
        while out[h]:
            k = out[h].pop(0)
            taker = min(takers, key=lambda t: (len(out[t]), t))
            out[taker].append(k)
            moves.append((k, h, taker))
    moves += _fill_empty(out, takers)
    return out, moves


def _fill_empty(shards: dict[str, list[int]], takers: list[str]) -> list[ShardMove]:
    moves = []
    for h in takers:
        donor = max(takers, key=lambda d: (len(shards[d]), d))
        if not shards[h] and len(shards[donor]) > 1:
            shards[h].append(shards[donor].pop())
            moves.append((shards[h][0], donor, h))
    return moves
