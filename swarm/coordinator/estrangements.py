"""`Estrangements`: members of one stage group that cannot reach each other, and which of them sits out.

Two members of a stage average their gradients with each other every iteration. When neither can open a stream
to the other (two home peers behind different NAT routers in a run without a relay, say), each goes ahead without
the other's gradients and their copies of the stage drift apart, while both stay alive and useful to everyone
else. Unreachable reports alone never catch this: one reporter per target is not believed, and each target's
heartbeat stays fresh.

Both reporting each other while both heartbeat is the sign: a dead peer reports nothing, and a single liar can
only ever get itself reported back. Then one of the two sits out (it is planned without, so the group that stays
is one whose members reach each other): the one that joined later, so the veteran keeps serving the stage. One way
round is caught too when the member reported says in its own signed record that it takes no connection
(`reachability = "unreachable"`: the coordinator's dial-back verdict, no relay): its mates' gradients cannot reach
it, so that one sits out. It is left out for a cool-down, `SIT_OUT` seconds the first time and doubled each time
the same pair is estranged again (a relay may come, or a port be forwarded, in between), then placed again like
any joiner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SIT_OUT = 60.0
"""Seconds the member that sits out is left out of the plan the first time its pair is estranged."""
MAX_SIT_OUT = 900.0


@dataclass(frozen=True)
class Estrangement:
    """`benched` sits out until `until` (monotonic seconds): it and `partner`, of one stage, cannot reach each
    other."""

    benched: str
    partner: str
    stage: int
    until: float
    times: int


class Estrangements:
    """Pairs of same-stage members that reported each other unreachable, and who sits out for how long.

    :param joined_at: when each peer was first seen (the later of a pair sits out)
    """

    def __init__(self, joined_at: Callable[[str], float]) -> None:
        self._joined_at = joined_at
        self._active: dict[str, Estrangement] = {}
        """Peer sitting out -> its estrangement."""
        self._times: dict[frozenset[str], int] = {}

    def estrange(self, a: str, b: str, stage: int, now: float, *, bench: str | None = None) -> Estrangement | None:
        """`a` and `b`, both members of `stage` and both alive, cannot reach each other: the new estrangement (who
        sits out, until when: `bench` if given, else the later to join), or None if one of them sits out already."""
        if a == b or a in self._active or b in self._active:
            return None
        pair = frozenset((a, b))
        times = self._times.get(pair, 0) + 1
        self._times[pair] = times
        if bench in (a, b):
            benched, partner = bench, (b if bench == a else a)
        else:
            benched, partner = sorted((a, b), key=lambda p: (self._joined_at(p), p), reverse=True)
        e = Estrangement(benched=benched, partner=partner, stage=stage, times=times,
                         until=now + min(MAX_SIT_OUT, SIT_OUT * 2 ** (times - 1)))
        self._active[benched] = e
        return e

    def sitting_out(self, now: float) -> set[str]:
        """The peers kept out of the plan now (an estrangement whose cool-down is over ends)."""
        for p in [p for p, e in self._active.items() if e.until <= now]:
            del self._active[p]
        return set(self._active)

    def forget(self, peer: str) -> None:
        """`peer` left the run: whoever sat out because of it may be placed again at once."""
        self._active.pop(peer, None)
        for p in [p for p, e in self._active.items() if e.partner == peer]:
            del self._active[p]
