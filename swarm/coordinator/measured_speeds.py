"""`MeasuredSpeeds`: how fast each peer's passes really run, against the speed it announced, for the planner.

A peer announces its seconds per layer once, from a bench at start (`PeerRecord.seconds_per_layer`); the planner
plans every path on it. A volunteer's machine drifts from that: its owner starts a job, it throttles, or the bench ran
while the whole swarm was starting. Every `done` (a data holder) and `pace` (a relay) says how many passes the peer
computed in an iteration and in how many seconds, so the scheduler knows each peer's slowdown: those seconds over what
the cost model gives its announced speed for the same passes (forward = layers x speed, backward `BACKWARD_FACTOR` x
forward, a holder's loss step at its announced `loss_seconds`). The median of a peer's last `REPORTS` reports is its
measured slowdown (`measured`). The plans take it relative to its kind's (`slowdown`: over the lower median of the
holders' or the relays' measured slowdowns, its own included): what every peer's passes share is no peer's slowdown. A
loaded host slows the whole swarm alike, and a small model's passes carry fixed costs (kernel launches, the copy of
the activations) that the per-layer cost model leaves out: with the tiny model's real compute in CI's local swarms the
absolute slowdowns came out 2-34x, and each drifted with the host's load. The planner plans on announced x relative
(`applied`).

A placed peer whose measured slowdown is `DRIFT` times off the one its epoch was planned with has drifted
(`drifted`): the scheduler weighs a re-plan of the paths for it (`CostDrift`), and every slowdown a plan took is the
planned one from then on (hysteresis: no re-plan until it drifts again).

Self-reported, so bounded: a slowdown below `FASTEST` (a peer claiming passes quicker than half its announcement, or
than half its kind's, to draw paths to itself) counts as `FASTEST`; a peer that claims slow passes only draws fewer
paths, and the median of its kind moves with a majority only. Relays far slower
than the others are benched besides (`SlowPeers`); this is for the many merely slower.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from scheduler.constants import BACKWARD_FACTOR, LOSS_FACTOR
from scheduler.schedule import Schedule
from swarm.constants import MAX_ID_CHARS
from swarm.wire import PeerRecord

REPORTS = 3
"""Reports a peer's measured slowdown is the median of (one slow iteration is a hiccup: a checkpoint written)."""
MIN_REPORTS = 2
"""Reports a measured slowdown needs before the planner takes it."""
DRIFT = 1.5
"""How many times off the cost an epoch was planned with a measured one must be to weigh a re-plan for it."""
FASTEST = 0.5
"""The smallest slowdown taken: a peer's claim to run more than twice as fast as it announced counts as twice."""
SLOWEST = 100.0
"""The largest slowdown taken (a peer that slow is benched or gone well before)."""


class MeasuredSpeeds:
    """Each peer's last slowdowns (measured over announced seconds per pass) and the ones the plans took.

    :param layers_per_stage: the model's layers on each stage (what a pass of each stage costs in layers)
    :param enabled: false: nothing is measured, every plan takes the announced speeds (`swarm.measured_speeds`)
    """

    def __init__(self, layers_per_stage: Sequence[int], enabled: bool = True) -> None:
        self.layers_per_stage = tuple(layers_per_stage)
        self.enabled = enabled
        self._seen: dict[str, deque[float]] = {}
        self._kind: dict[str, str] = {}
        """Peer -> "holder" or "relay": whose slowdowns its own is taken relative to."""
        self._restored: dict[str, float] = {}
        """Peer -> the slowdown a predecessor scheduler planned with, until this one has measured its own."""
        self._planned: dict[str, float] = {}
        """Peer -> the slowdown the newest plan (or decision not to re-plan) took; absent: 1 (as announced)."""

    def note(self, peer: str, schedule: Schedule | None, operations: int, compute: float,
             record: PeerRecord | None) -> None:
        """`peer` computed `operations` passes in `compute` seconds under epoch `schedule` (None: one this scheduler
        does not know); it announced `record` (None: not live, nothing to compare with). Nothing where off."""
        stage = schedule.placement.get(peer, -1) if schedule is not None else -1
        if not self.enabled or record is None or operations <= 0 or not 0 <= stage < len(self.layers_per_stage) \
                or not math.isfinite(compute):
            return
        layers = max(1, self.layers_per_stage[stage])
        forward = layers * record.seconds_per_layer
        # a relay's passes are forwards and backwards, one each a microbatch; a holder's add the loss step
        per_microbatch = forward * (1 + BACKWARD_FACTOR)
        if stage == 0:
            per_microbatch += record.loss_seconds if record.loss_seconds > 0 else LOSS_FACTOR * forward
        slowdown = compute / (operations / 2 * per_microbatch)
        if self._kind.get(peer) != ("holder" if stage == 0 else "relay"):  # moved between kinds: measured anew
            self._seen.pop(peer, None)
            self._kind[peer] = "holder" if stage == 0 else "relay"
        self._seen.setdefault(peer, deque(maxlen=REPORTS)).append(min(SLOWEST, max(FASTEST, slowdown)))

    def measured(self, peer: str) -> float | None:
        """`peer`'s passes over what its announced speed gives them, the median of its last `REPORTS` reports (None:
        fewer than `MIN_REPORTS`)."""
        seen = self._seen.get(peer, ())
        return statistics.median(seen) if len(seen) >= MIN_REPORTS else None

    def slowdown(self, peer: str) -> float | None:
        """`peer`'s slowdown for the plans: its measured one over the lower median of its kind's (the holders' or the
        relays', its own included; see the module docstring), within [`FASTEST`, `SLOWEST`]. A predecessor's figure
        until measured; None: neither."""
        own = self.measured(peer)
        if own is None:
            return self._restored.get(peer)
        kind = self._kind[peer]
        mates = [m for p, k in self._kind.items() if k == kind and (m := self.measured(p)) is not None]
        return min(SLOWEST, max(FASTEST, own / statistics.median_low(mates)))

    def applied(self, records: Mapping[str, PeerRecord]) -> dict[str, PeerRecord]:
        """`records` with each peer's announced speeds (seconds per layer, loss step) times its measured slowdown,
        for a plan; the slowdowns taken become the planned ones."""
        out = {}
        for p, r in records.items():
            k = self.slowdown(p)
            self._planned[p] = 1.0 if k is None else k
            out[p] = r if k is None else dataclasses.replace(r, seconds_per_layer=min(3600.0, r.seconds_per_layer * k),
                                                             loss_seconds=min(3600.0, r.loss_seconds * k))
        return out

    def drifted(self, peers: Collection[str]) -> dict[str, tuple[float, float]]:
        """The peers of `peers` whose measured slowdown is `DRIFT` times off the planned one: peer -> (planned,
        measured)."""
        out = {}
        for p in peers:
            k, planned = self.slowdown(p), self._planned.get(p, 1.0)
            if k is not None and max(k / planned, planned / k) >= DRIFT:
                out[p] = (planned, k)
        return out

    def to_meta(self) -> dict[str, float]:
        """The slowdowns the newest plan took, not 1 (for a successor: `restore`)."""
        return {p: round(k, 4) for p, k in sorted(self._planned.items()) if k != 1.0}

    def restore(self, saved: Any) -> list[str]:
        """Start from the slowdowns a predecessor planned with (`to_meta`): each counts, as planned and as measured,
        until this scheduler has measured the peer itself. What was wrong with `saved` (entries dropped)."""
        if saved is None:
            return []
        if not isinstance(saved, dict):
            return [f"speeds: a {type(saved).__name__}, not a map"]
        wrong = []
        for p, k in saved.items():
            if not isinstance(p, str) or not 0 < len(p) <= MAX_ID_CHARS or isinstance(k, bool) or \
                    not isinstance(k, (int, float)) or not FASTEST <= k <= SLOWEST:
                wrong.append(f"speeds[{str(p)[:MAX_ID_CHARS]!r}] = {str(k)[:40]!r}")
                continue
            self._restored[p] = self._planned[p] = float(k)
        return wrong

    def forget(self, peers: Collection[str]) -> None:
        """`peers` left the run or were benched: placed again, each is planned at its announced speed until measured
        anew (the job that slowed it may be over)."""
        for p in peers:
            self._seen.pop(p, None)
            self._kind.pop(p, None)
            self._restored.pop(p, None)
            self._planned.pop(p, None)

