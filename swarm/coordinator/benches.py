"""`Benches`: peers taken off the run's work for a while, because they are slow for good.

A data holder the commits still leave out for being late at its smallest share (`HolderShares`, share `OFF`), or a
relay whose own passes stay far slower than the other relays' (`SlowRelays`), costs the run more than its work brings:
iterations wait for it, and its stage's averaging waits on its slow part too. It is planned without, as a peer sitting
out: it stays alive and is not declared gone, its work goes to the others (a holder's shards at the last commit's
positions), and it is told why and for how long (`Benched`). The bench lasts `BENCH` seconds (`swarm.bench_seconds`)
the first time, doubled each time the same peer is benched again (up to `MAX_BENCH`); then it is placed again like any
joiner, at its whole share: a volunteer's machine slowed by its owner's job is tried again once the job may be over,
and one slow for good costs the run less each time. Which peers may go is `SlowPeers`' to say (a stage keeps a peer).

A successor scheduler keeps them: every epoch published carries them (`to_meta`: seconds left, not a clock time, since
the successor's clock is another machine's), and the successor `restore`s them from the newest epoch it knows (a bench
may so last longer by the time from that epoch's publication to the take-over).
"""

from __future__ import annotations

import math
from typing import Any

from swarm.constants import MAX_ID_CHARS

BENCH = 300.0
"""Seconds a peer is kept off the run's work the first time, by default (`swarm.bench_seconds`)."""
MAX_BENCH = 3600.0


class Benches:
    """The peers kept off the run's work now, until when (monotonic seconds), and how often each was benched.

    :param first: seconds of a peer's first bench (the run's `swarm.bench_seconds`); 0: no peer is ever benched
    """

    def __init__(self, first: float = BENCH) -> None:
        self.first = first
        self._until: dict[str, float] = {}
        self._times: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.first > 0

    def bench(self, peer: str, now: float) -> float:
        """Keep `peer` off the run's work from `now`: the seconds it sits out (longer each time it is benched)."""
        times = self._times.get(peer, 0) + 1
        self._times[peer] = times
        seconds = min(max(MAX_BENCH, self.first), self.first * 2 ** (times - 1))
        self._until[peer] = now + seconds
        return seconds

    def benched(self, now: float) -> set[str]:
        """The peers kept off the run's work now (a bench that is over ends)."""
        for p in [p for p, until in self._until.items() if until <= now]:
            del self._until[p]
        return set(self._until)

    def to_meta(self, now: float) -> dict[str, list]:
        """Every peer benched in this run: [seconds its bench has left (0: over), times benched], for a successor."""
        return {p: [round(max(0.0, self._until.get(p, now) - now), 1), n] for p, n in sorted(self._times.items())}

    def restore(self, saved: Any, now: float) -> list[str]:
        """Take over the benches a predecessor published (`to_meta`, read from an epoch: checked, as anything read
        is); returns what was wrong with the entries dropped."""
        if not isinstance(saved, dict):
            return [f"benches: a {type(saved).__name__}, not a map"] if saved is not None else []
        wrong = []
        for peer, entry in saved.items():
            left, times = entry if isinstance(entry, list) and len(entry) == 2 else (None, None)
            if not isinstance(peer, str) or not 0 < len(peer) <= MAX_ID_CHARS or type(times) is not int or \
                    not 1 <= times <= 64 or type(left) not in (int, float) or not math.isfinite(left) or \
                    not 0 <= left <= max(MAX_BENCH, self.first):
                wrong.append(f"bench {str(peer)[:MAX_ID_CHARS]!r}: {str(entry)[:80]}")
                continue
            self._times[peer] = times
            if left > 0:
                self._until[peer] = now + left
        return wrong
