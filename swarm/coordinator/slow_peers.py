"""`SlowPeers`: what the scheduler does about peers slow for good, holders and relays alike.

A data holder the commits keep leaving out for being late is given a smaller share of its microbatches
(`SlowHolders`), and one no share helps is benched; a relay whose own passes stay far slower than the other relays'
(`SlowRelays`, from its `Pace` reports) is benched with no share step before (its work is what the paths bring it,
not a count the scheduler sets): its work goes to its stage mates. A benched peer is planned without for a while
(`Benches`), as a peer sitting out: alive, not declared gone, told why and for how long (`Benched`), then placed again
like any joiner.

Its stage must keep a serving peer. A holder is never the last of stage 0; a relay that is the last of its stage is
benched only where a peer of another later stage can be spared to take the stage over: it is planned without as if it
were leaving (`handing_over`), serves the iteration in progress, and hands its stage's state to the peer moved there,
rather than leaving the stage unserved (its layers untrained) or its state lost. Bookkeeping and decisions only: the
scheduler announces and re-plans. Each epoch published carries the shares and benches (`to_meta`), so that a
successor scheduler does not give a slow holder its whole share back nor place a benched peer at once (`restore`).

Peers merely slower than they announced are neither shared down nor benched: every plan takes their measured speeds
(`MeasuredSpeeds`, from the same reports), and paths are re-planned for one whose speed drifts where that pays
(`CostDrift`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from scheduler.schedule import Schedule
from swarm.control.messages import Benched, Done, Pace
from swarm.coordinator.benches import Benches
from swarm.coordinator.measured_speeds import MeasuredSpeeds
from swarm.coordinator.slow_holders import SlowHolders
from swarm.coordinator.slow_relays import SlowRelays
from swarm.events import event
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)


class SlowPeers:
    """The slow holders' shares, the slow relays' verdicts and the benches of one run.

    :param microbatches: microbatches a holder injects per shard at its whole share (the run's `microbatches`)
    :param bench_seconds: a peer's first bench (the run's `swarm.bench_seconds`; 0: none is benched)
    :param layers_per_stage: the model's layers on each stage
    :param measured_speeds: whether plans take the peers' measured speeds (`MeasuredSpeeds`; the run's
      `swarm.measured_speeds`)
    """

    def __init__(self, microbatches: int, bench_seconds: float, layers_per_stage: Sequence[int], *,
                 measured_speeds: bool = False) -> None:
        self.benches = Benches(bench_seconds)
        self.holders = SlowHolders(microbatches, benching=self.benches.enabled)
        self.relays = SlowRelays(layers_per_stage)
        self.speeds = MeasuredSpeeds(layers_per_stage, measured_speeds)
        self._handing_over: set[str] = set()

    def done(self, report: Done, schedule: Schedule | None, record: PeerRecord | None) -> None:
        """A holder's `done` under its epoch `schedule` (None: one this scheduler does not know), counted or not,
        from the peer of `record` (None: not live): how quick its passes were."""
        self.holders.note(report)
        self.speeds.note(report.peer, schedule, report.operations, report.compute, record)

    def paced(self, report: Pace, schedule: Schedule | None, record: PeerRecord | None, completed: int) -> list[str]:
        """A relay's pace under its epoch `schedule` (None: an epoch this scheduler does not know), from the peer of
        `record` (None: not live): the relays it makes slow for good (none where benches are off). Only a committed
        iteration's report counts (one reported before its commit may yet run again)."""
        if report.iteration > completed:
            return []
        self.speeds.note(report.peer, schedule, report.operations, report.compute, record)
        if not self.benches.enabled or schedule is None or record is None:
            return []
        return self.relays.note(report, schedule, record.seconds_per_layer)

    def handing_over(self, placement: Collection[str]) -> set[str]:
        """The benched peers of `placement` still to be planned without as if leaving (once an epoch has planned
        without them, none)."""
        self._handing_over &= set(placement)
        return set(self._handing_over)

    def bench(self, peers: list[str], schedule: Schedule, serving: Collection[str], iteration: int,
              now: float) -> list[Benched]:
        """Take `peers` of the newest epoch `schedule` off the run's work from `iteration` on, `serving` being the
        live peers not kept out; the messages that tell them (for those whose stage can do without them)."""
        serving = set(serving)
        told = []
        for p in peers:
            stage = schedule.placement.get(p)
            if stage is None or p not in serving:
                continue
            why = "late at its smallest share" if stage == 0 else self.relays.why(p)
            per_stage = Counter(st for q, st in schedule.placement.items() if q in serving)
            if per_stage[stage] < 2 and not (stage > 0 and any(n >= 2 for st, n in per_stage.items() if st > 0)):
                logger.warning("%s is %s, but its stage %d has no other peer, nor can one be spared: it stays", p,
                               why, stage)
                continue
            if per_stage[stage] < 2:
                self._handing_over.add(p)
            seconds = self.benches.bench(p, now)
            self.forget([p])
            serving.discard(p)
            logger.warning("%s is %s: it is taken off the run's work for %.0f s from iteration %d (not taken for "
                           "gone)%s, then placed again", p, why, seconds, iteration,
                           f", handing stage {stage} over" if p in self._handing_over else "",
                           extra=event("holder_benched" if stage == 0 else "relay_benched", peer=p, seconds=seconds,
                                       iteration=iteration))
            told.append(Benched(peer=p, iteration=iteration, seconds=seconds))
        return told

    def to_meta(self, now: float) -> dict[str, Any]:
        """What a successor scheduler needs to go on as this one would (`restore`): the holders' shares, the benches
        and the slowdowns the newest plan took (none: empty)."""
        saved = {"shares": self.holders.shares.slowed, "benched": self.benches.to_meta(now),
                 "speeds": self.speeds.to_meta()}
        return {k: v for k, v in saved.items() if v}

    def restore(self, saved: Any, now: float) -> None:
        """Go on from what a predecessor published with its newest epoch (`to_meta`; malformed entries are dropped,
        logged). The relays' verdicts start afresh: a slow relay is found again within a few iterations."""
        if saved is None or not isinstance(saved, dict):
            if saved is not None:
                logger.warning("the predecessor's slow peers: a %s, not a map: dropped", type(saved).__name__)
            return
        wrong = self.holders.shares.restore(saved.get("shares")) + self.benches.restore(saved.get("benched"), now) + \
            self.speeds.restore(saved.get("speeds"))
        if wrong:
            logger.warning("the predecessor's slow peers: dropped %s", "; ".join(wrong[:5]))
        if saved:
            logger.info("went on from the predecessor's slow peers: shares %s, benched %s, speeds %s",
                        self.holders.shares.slowed, sorted(self.benches.benched(now)), self.speeds.to_meta())

    def benched(self, now: float) -> set[str]:
        return self.benches.benched(now)

    def forget(self, peers: Collection[str]) -> None:
        """`peers` left the run or were benched: placed again, each starts afresh (a bench stays: one restarted
        with its key is still too slow for now)."""
        self.holders.forget(peers)
        self.relays.forget(peers)
        self.speeds.forget(peers)
