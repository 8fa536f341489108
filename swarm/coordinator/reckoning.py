"""What a new epoch reckons against the epoch in force before its start: the moves of an epoch it replaces that it
carries over, its joiners (who load their stage's state) and where they restore a stage nobody kept serving from.

A plan made off the scheduler's loop may have to start later than asked, once iterations committed while it was
made; if another epoch came into force meanwhile, what it reckoned against the one before may no longer hold.
`reckoned_alike` tells whether it still does, so that such a plan is moved to its new start rather than made again
(4-7 s on a loaded 20-peer host, during which the next change waits). Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from scheduler.schedule import Schedule
from swarm.wire import PeerRecord, PeerState


def carried_moves(schedule: Schedule, old: Schedule, before: Schedule | None) -> dict[str, str]:
    """The moves of `old` (the epoch `schedule` follows; its `meta["handover"]`: mover -> the peer it takes its new
    stage's state from) not yet taken when `schedule` starts (`before` in force then): they stand."""
    earlier = old.meta.get("handover") or {}
    return {p: src for p, src in earlier.items() if p in schedule.placement and before is not None
            and p in before.placement and before.placement[p] != schedule.placement[p]}


def epoch_joiners(schedule: Schedule, before: Schedule | None, peers: Mapping[str, PeerRecord],
                  stateless: Collection[str], handover: Collection[str]) -> list[str]:
    """The peers of `schedule` that load their stage's state from its peers, `before` in force at its start:
    newcomers, a peer taken for gone and placed again on another stage than it held (it has none of that stage's
    weights, and nobody hands them over unless it is among `handover`'s movers), a peer that holds no state at all
    (`stateless`), and a joiner of `before` whose record (`peers`) still says it is joining: that epoch placing it
    does not mean its stage's state came (listed as a veteran, it would give its join up at every such epoch)."""
    loading = set(before.meta.get("joiners", ())) if before is not None else set()
    return [p for p in schedule.placement if before is None or p not in before.placement or p in stateless
            or (before.placement[p] != schedule.placement[p] and p not in handover)
            or (p in loading and p in peers and peers[p].state == PeerState.JOINING)]


def restore_sources(schedule: Schedule, before: Schedule | None, joiners: Collection[str]) -> dict[str, str]:
    """Joiner (a peer new to its stage, or one holding no state of it) -> the peer it starts the stage from, for
    stages nobody kept serving: a veteran of the nearest stage below (above if none); a joiner uses its own
    checkpoint of the stage instead if it has one. Stage 0 too: its holders may all be gone while a joining holder
    takes it over (it keeps its own embedding)."""
    if before is None:
        return {}
    veterans = {p: st for p, st in schedule.placement.items() if p not in joiners and before.placement.get(p) == st}
    sources = {}
    for p in joiners:
        st = schedule.placement[p]
        if st in veterans.values():
            continue
        nearest = sorted((abs(vs - st), vs > st, vs == 0, q) for q, vs in veterans.items())
        if nearest:
            sources[p] = nearest[0][3]
    return sources


def reckoned_alike(schedule: Schedule, old: Schedule, before: Schedule | None, now_before: Schedule,
                   peers: Mapping[str, PeerRecord], stateless: Collection[str]) -> bool:
    """Whether `schedule` (made after `old`, reckoned against `before`) carries the same moves, and names the same
    joiners and restore sources, against `now_before`, the epoch in force before its new start. Its placement stands
    either way where `now_before` is `old` itself: the peers `old` placed on stages they did not hold yet were kept
    from moving again, and with `old` in force they hold them; no other peer's standing changes."""
    if before is None or now_before.epoch != old.epoch:
        return False
    handover = schedule.meta.get("handover") or {}
    if carried_moves(schedule, old, before) != carried_moves(schedule, old, now_before):
        return False
    joiners = epoch_joiners(schedule, before, peers, stateless, handover)
    now_joiners = epoch_joiners(schedule, now_before, peers, stateless, handover)
    return joiners == now_joiners and \
        restore_sources(schedule, before, joiners) == restore_sources(schedule, now_before, now_joiners)
