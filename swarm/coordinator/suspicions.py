"""`Suspicions`: what the scheduler makes of one peer's word against another; no I/O.

Peers report each other: a stream that would not open (`Unreachable`), a microbatch broken at a relay (`Broken`),
an averaging input refused as proof of a fault (`Faulty`). One word never convicts: a lone report makes the
scheduler ask the peer itself (`Pings`), and a peer is declared gone in `Liveness` only once a second witness
agrees (a second reporter, the ping unanswered, its own heartbeat overdue; `UnreachableReports`). Two members of
a stage that report each other unreachable while both are alive cannot average: one sits out a while
(`Estrangements`). Two members of a group that prove another faulty in two iterations evict it for good
(`FaultReports`). The scheduler re-plans on what this leaves in `Liveness`; the answers here are only what to
gossip.
"""

from __future__ import annotations

import logging

from scheduler.schedule import Schedule
from swarm.control.messages import Broken, Faulty, Refused, SitOut
from swarm.coordinator.actions import Announce
from swarm.coordinator.epochs import EpochHistory
from swarm.coordinator.estrangements import Estrangements
from swarm.coordinator.fault_reports import FaultReports
from swarm.coordinator.gone_notices import GoneNotices
from swarm.coordinator.liveness import Liveness
from swarm.coordinator.pings import Pings, ping_timeout
from swarm.events import event

logger = logging.getLogger(__name__)

MASS_SILENCE_SHARE = 0.5
"""Pings to this share of the placed peers (and at least `MASS_SILENCE_MIN`) going unanswered within one ping's wait
are the scheduler's own silence, not that many deaths: each is asked once more before it counts. On a loaded 20-peer
host 15 of 19 pings went unanswered within 3 s at once (the DHT and gossip stalled for the scheduler's host), and
live peers were taken for gone; churn of 10% of the peers a minute kills one or two at a time."""
MASS_SILENCE_MIN = 3


class Suspicions:
    """The reports against peers of one run, judged into `liveness`. `now` arguments are monotonic seconds.

    :param liveness: the scheduler's liveness, where convictions are declared
    :param heartbeat: the run's heartbeat period (how long a ping waits: `ping_timeout`)
    :param gone: the peers the scheduler told the run are gone (reports about them are no news)
    """

    def __init__(self, liveness: Liveness, heartbeat: float, gone: GoneNotices | None = None) -> None:
        self.liveness = liveness
        self.gone = gone or GoneNotices()
        self.pings = Pings(ping_timeout(heartbeat))
        """Peers one peer reported unreachable, asked whether they are alive (`swarm.coordinator.pings`)."""
        self.estrangements = Estrangements(liveness.first_seen)
        """Same-stage members that cannot reach each other: one of each pair sits out for a while."""
        self.evicted: set[str] = set()
        """Peers voted out of the run (never admitted again under their key)."""
        self._fault_reports = FaultReports()
        self._broken_at: dict[str, set[str]] = {}
        """Peer -> the peers that reported a microbatch of the iteration in progress broken at it."""
        self._silences: list[tuple[str, float]] = []
        """(Peer, when its ping went unanswered), within the last ping's wait."""
        self._asked_again: set[str] = set()
        """Peers whose unanswered ping was put down to a mass silence and asked once more."""

    def committed(self) -> None:
        """The iteration in progress was committed: witnesses of broken microbatches count within one iteration."""
        self._broken_at.clear()

    def ping(self, peer: str, now: float, unread: bool = False) -> list[Announce]:
        """Ask `peer`, reported unreachable (or, `unread`, missed by the reads: `Liveness.asked`) and not (yet)
        declared gone, whether it is alive. Missed by the reads while a ping for a report is in flight, it is asked
        by that one."""
        ping = None if peer in self.liveness.declared_gone else self.pings.send(peer, now)
        if unread and (sent := self.pings.sent(peer)) is not None:
            self.liveness.asked(peer, sent)
        return [Announce(ping)] if ping is not None else []

    def pong(self, sender: str, nonce: int, now: float) -> None:
        """`sender` answered a ping: it is alive, if the answer is its own ping's."""
        if self.pings.answer(sender, nonce):
            logger.info("%s answered the scheduler's ping: alive", sender)
            self.liveness.answered(sender, now)
            self._asked_again.discard(sender)

    def expire_pings(self, now: float, placed: int) -> list[Announce]:
        """Take the pings that waited their timeout out as witnesses against their peers, `placed` peers being
        placed; where much of the swarm went silent at once (`MASS_SILENCE_SHARE`), ask each once more instead."""
        late = self.pings.unanswered(now)
        self._silences = [(p, t) for p, t in self._silences if now - t < self.pings.timeout and p not in late]
        self._silences += [(p, now) for p in late]
        mass = len(self._silences) >= max(MASS_SILENCE_MIN, MASS_SILENCE_SHARE * placed)
        again = [p for p in late if mass and p not in self._asked_again]
        if again:
            logger.warning("%d of %d placed peers did not answer the scheduler's ping within %.0f s: more likely this "
                           "scheduler's own silence (its host or gossip stalled) than their deaths; asked once more: "
                           "%s", len(self._silences), placed, self.pings.timeout, ", ".join(sorted(again)),
                           extra=event("pings_repeated", peers=sorted(again), silent=len(self._silences),
                                       placed=placed))
        for peer in late:
            if peer not in again:
                self._asked_again.discard(peer)
                logger.info("%s did not answer the scheduler's ping within %.0f s", peer, self.pings.timeout)
                self.liveness.unanswered(peer, now)
        self._asked_again.update(again)
        for peer in again:  # live while the new ping is awaited, as a peer the reads missed is
            self.liveness.asked(peer, now)
        return [Announce(ping) for p in again if (ping := self.pings.send(p, now)) is not None]

    def faulty(self, sender: str, report: Faulty, epochs: EpochHistory) -> list[Announce]:
        """A member refused another one's averaging input as proof of a fault: two such members evict it."""
        schedule = next((s for s in epochs.all if s.epoch == report.epoch), None)
        if schedule is None or report.suspect in self.evicted:
            return []
        why = self._fault_reports.report(sender, report.suspect, report.iteration, schedule.placement)
        if why is None:
            return []
        self.evicted.add(report.suspect)
        self.liveness.declare_gone(report.suspect, f"evicted: {why}", witness="faulty")
        return [Announce(Refused(peer=report.suspect, why=f"evicted: {why}", evicted=True))]

    def unreachable(self, sender: str, target: str, schedule: Schedule | None, now: float) -> list[Announce]:
        """A peer of the newest epoch `schedule` could not open a stream to another one."""
        if schedule is None or target not in schedule.placement or sender not in schedule.placement or \
                sender in self.liveness.declared_gone or self.gone.told(target, schedule):
            return []
        self.liveness.report_unreachable(sender, target, now)
        ping = self.ping(target, now)
        stage = schedule.placement[sender]
        live = self.liveness.live(now)
        if schedule.placement[target] != stage or not {sender, target} <= set(live):
            return ping
        if target in self.liveness.reporters(sender, now):  # both ways
            return ping + self._estrange(sender, target, stage, now)
        if live[target].reachability == "unreachable":
            # one way: the target says the coordinator's dial-back found it takes no connection (and it is not
            # relayed); its mate's gradients cannot reach it, so it sits out (its own word only ever benches itself)
            return ping + self._estrange(sender, target, stage, now, bench=target)
        return ping

    def broken(self, sender: str, report: Broken, epochs: EpochHistory, iteration: int, now: float) -> list[Announce]:
        """A microbatch of `iteration`, the one in progress, broke at a peer (its holder re-queues it). The reporter's
        word is one report that the peer is unreachable: the peer is taken for gone once that is corroborated
        (`UnreachableReports`: a second reporter, the scheduler's ping unanswered, or its own heartbeat overdue),
        never on one word. The reporter is judged by the epoch its report names, the one running the iteration or
        the newest (a re-plan published meanwhile may leave the reporter out; what broke on its paths is still
        news), and the suspect must be placed in that epoch and in the newest (one the newest no longer places, a
        peer told to sit out say, is planned around already: its mates' microbatches in flight through it say
        nothing of its death)."""
        suspect, newest, named = report.gone, epochs.latest, epochs.get(report.epoch)
        if newest is None or named is None or named not in (newest, epochs.in_force(iteration)) or \
                sender not in named.placement or suspect not in named.placement or \
                suspect not in newest.placement or suspect in self.liveness.declared_gone or \
                self.gone.told(suspect, newest) or report.iteration != iteration:
            return []
        self.liveness.report_unreachable(sender, suspect, now)
        # the same iteration's microbatches broken at `suspect` by two peers, whatever the time between (its reruns
        # under new epochs included): a relay that corrupts what one holder's paths carry in one epoch and another
        # holder's in the next would otherwise stall every rerun, each witness alone (reports expire in seconds)
        witnesses = self._broken_at.setdefault(suspect, set())
        witnesses.add(sender)
        if len(witnesses) >= 2 and suspect not in self.liveness.declared_gone:
            self.liveness.declare_gone(suspect, f"microbatches of iteration {report.iteration} broke at it for "
                                                f"{len(witnesses)} peers ({', '.join(sorted(witnesses)[:3])})", now,
                                       witness="broken")
        return self.ping(suspect, now)

    def _estrange(self, a: str, b: str, stage: int, now: float, *, bench: str | None = None) -> list[Announce]:
        """`a` and `b`, of one stage group, both alive, cannot reach each other (both reported it, or `bench` cannot
        be dialled and was reported): they cannot average, and their copies of the stage would drift apart. One sits
        out (`bench` if given; the next look re-plans without it); it is told."""
        e = self.estrangements.estrange(a, b, stage, now, bench=bench)
        if e is None:
            return []
        seconds = round(e.until - now, 1)
        logger.warning("%s and %s of stage %d cannot reach each other, so they cannot average: %s sits out for "
                       "%.0f s (the run goes on without it, then places it again)", e.partner, e.benched, stage,
                       e.benched, seconds, extra=event("estranged", peer=e.benched, partner=e.partner, stage=stage,
                                                       seconds=seconds))
        return [Announce(SitOut(peer=e.benched, partner=e.partner, stage=stage, seconds=seconds))]
