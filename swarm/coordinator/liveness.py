"""`Liveness`: which peers the scheduler takes for alive, from their heartbeat records and the peers' reports.

A peer is live while its signed record was seen within its lifetime (three heartbeats and a grace), or it answered the
scheduler's ping or sent it a new message that recently (`heard_from`), it has not announced that it leaves, and
corroborated reports do not show it dead (`UnreachableReports`). One DHT read can miss a record on a busy swarm, so a
record absent from one read does not make a peer gone; and on a loaded 20-peer swarm the DHT stalled for everyone at
once (15 s without a read, then reads that missed half the live peers). So a placed peer missing from the reads for
over `UNREAD_HEARTBEATS` is pinged over gossip (`unread`, `asked`), and its answer keeps it live. A placed peer is
taken for gone on its record only once a ping sent since it was last heard from went unanswered: a dying peer is pinged
well before its record runs out, and one whose record ran out before the scheduler could ask it (its DHT reads stalled,
or its loop was held up planning and publishing epochs: 8 s in a 20-peer churn run, which took 4 live relays for gone
at once) is asked first, at the cost of one ping's wait where it is really dead. Its heartbeat's age, which
corroborates a lone report, is known only while the newest read shows its record: one that read missed has no known
age, and the scheduler's ping decides instead (a frozen peer's record is still read, with its true age, until it
expires).

A peer declared gone that turns out alive and asks to be placed again (a joining record written after it was
declared gone) is taken back only after a cool-down
(`rejoin_after`): a few seconds the first time, so that the scheduler publishes an epoch without it first, then
30 s, doubled each time it is declared gone again. A peer that keeps failing its neighbours (a corrupting or
half-reachable relay) would otherwise be placed again at once, in every epoch, and stall each one. A peer learns it
was declared gone from an epoch without it; where none can be planned (it was the last data holder), the scheduler
takes it back while it keeps beating, after the same cool-down (`take_back`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from swarm.constants import silent_after
from swarm.coordinator.pings import ping_timeout
from swarm.coordinator.unreachable_reports import UnreachableReports
from swarm.events import event
from swarm.wire import PeerRecord, PeerState

logger = logging.getLogger(__name__)

FIRST_REJOIN_COOLDOWN = 5.0
"""Seconds a peer declared gone for the first time waits before it may be placed again: long enough for the
scheduler to publish an epoch without it (a joiner wrongly taken for gone once, say, is back within seconds)."""
REJOIN_COOLDOWN = 30.0
"""Seconds it waits the second time; doubled each time after."""
MAX_REJOIN_COOLDOWN = 600.0
UNREAD_HEARTBEATS = 1.5
"""Heartbeat periods a placed peer may be missing from the scheduler's reads before it is pinged: early enough for
its answer (a ping waits one period) to come before its record's lifetime (three periods and a grace) is out."""


def rejoin_after(times_declared: int) -> float:
    """Seconds before a peer declared gone `times_declared` times (>= 1) may be placed again."""
    if times_declared <= 1:
        return FIRST_REJOIN_COOLDOWN
    return min(MAX_REJOIN_COOLDOWN, REJOIN_COOLDOWN * 2 ** (times_declared - 2))

class Liveness:
    """The scheduler's view of who is alive. Fed each DHT read (`update`) and each unreachable report.

    :param heartbeat: the run's heartbeat period in seconds
    :param exclude: a peer never counted as a live member (the coordinator's own heartbeat record)
    """

    def __init__(self, heartbeat: float, *, exclude: str | None = None) -> None:
        self.heartbeat = heartbeat
        self.exclude = exclude
        self.records: dict[str, PeerRecord] = {}
        """Every peer's newest record seen (live or not)."""
        self._first_seen: dict[str, float] = {}
        self._last_seen: dict[str, float] = {}
        """When each peer's record was last in a read."""
        self._last_read = float("-inf")
        """When the newest read was taken in."""
        self._answered_at: dict[str, float] = {}
        """When each peer last answered the scheduler's ping or sent it a new message (as good as a read of a fresh
        record)."""
        self._numbers: dict[str, int] = {}
        """The highest sequence number of a message seen from each peer with a record (`heard_from`)."""
        self._asked: dict[str, float] = {}
        """When the scheduler last pinged each peer the reads missed (`asked`)."""
        self._unanswered: dict[str, float] = {}
        """When a ping to each peer last went unanswered."""
        self._ping_wait = ping_timeout(heartbeat)
        self._heartbeat_age: dict[str, float] = {}
        self._leaving: set[str] = set()
        self._left_at: dict[str, float] = {}
        """When each leaving peer's leave was first seen."""
        self._reports = UnreachableReports(heartbeat)
        self.declared_gone: set[str] = set()
        """Peers taken for gone on reports, before their records expire."""
        self.stateless: set[str] = set()
        """Peers that left and joined again, until their record shows them online: they hold no stage's state, so
        whatever places them next makes them joiners (a placement from before they left says otherwise)."""
        self._declared_at: dict[str, float] = {}
        self._times_declared: dict[str, int] = {}
        self._now = 0.0

    def update(self, records: Mapping[str, tuple[PeerRecord, float]], now: float) -> dict[str, PeerRecord]:
        """Take in one DHT read (peer -> (record, seconds since its heartbeat)); returns the live peers."""
        for p, (record, age) in records.items():
            if record.state == PeerState.LEAVING:
                self._left_at.setdefault(p, now)
                self._leaving.add(p)
            elif p in self._leaving and record.state == PeerState.JOINING and age < now - self._left_at[p]:
                # the same key joins again (a restarted process, or a joiner whose stage's state did not come): a
                # record written after its leave was seen
                logger.info("%s, which left, joins again", p)
                self._leaving.discard(p)
                del self._left_at[p]
                self._first_seen[p] = now  # a joiner afresh: it settles and probes before it is placed
                self.stateless.add(p)
            elif record.state == PeerState.ONLINE:
                self.stateless.discard(p)
            self._first_seen.setdefault(p, now)
            self._last_seen[p] = now
            self.records[p], self._heartbeat_age[p] = record, age
        self._last_read = now
        self._judge(now)
        return self.live(now)

    def live(self, now: float) -> dict[str, PeerRecord]:
        """The live peers as of the last read and the reports since."""
        return {p: r for p, r in self.records.items() if self._standing(p) and self._fresh(p, now)}

    def not_declared(self, peers: Collection[str]) -> dict[str, PeerRecord]:
        """Those of `peers` with a record, neither leaving nor declared gone, however old their record is: what stays
        placed when a declaration, not a read, prompts a re-plan (the reads judge records by their age, pinging
        first those a stalled DHT let run out)."""
        return {p: self.records[p] for p in peers if p in self.records and self._standing(p)}

    def unread(self, peers: Collection[str], now: float) -> list[str]:
        """Those of `peers` (the placed ones), neither leaving nor declared gone, that were neither in a read nor
        heard from for `UNREAD_HEARTBEATS`: to ping (and note it, `asked`), so that a DHT whose reads miss their
        records does not make them gone. Those whose record's lifetime ran out meanwhile are among them (on a
        loaded 20-peer swarm the reads stalled and then missed 8-11 of 19 live peers at once, and the scheduler's
        loop, planning, did not look for 8 s while 4 live relays' records ran out); one that does not answer is not
        asked again until it is heard from (`unanswered`), and is gone."""
        return [p for p in peers if p in self.records and self._standing(p)
                and now - self._heard(p) > UNREAD_HEARTBEATS * self.heartbeat
                and self._unanswered.get(p, float("-inf")) < self._heard(p)]  # not again once silent

    def asked(self, peer: str, now: float) -> None:
        """The scheduler pinged `peer`, which the reads missed: until the ping's wait is out, its record's
        lifetime running out does not make it gone (its answer, `answered`, keeps it live)."""
        self._asked[peer] = now

    def _standing(self, peer: str) -> bool:
        """Neither leaving, nor declared gone, nor the coordinator's own record."""
        return peer not in self._leaving and peer not in self.declared_gone and peer != self.exclude

    def _fresh(self, peer: str, now: float) -> bool:
        """Read or heard from within its record's lifetime, or pinged since and the ping still awaited."""
        heard = self._heard(peer)
        if now - heard <= silent_after(self.heartbeat):
            return True
        asked = self._asked.get(peer)
        return asked is not None and asked >= heard and now - asked <= self._ping_wait

    def _heard(self, peer: str) -> float:
        """When `peer`'s record was last read, or it last answered a ping, whichever is later."""
        return max(self._last_seen[peer], self._answered_at.get(peer, float("-inf")))

    def first_seen(self, peer: str) -> float:
        """When `peer`'s record was first seen (infinity if never)."""
        return self._first_seen.get(peer, float("inf"))

    def seen_for(self, peer: str, now: float) -> float:
        """Seconds since `peer`'s record was first seen (0 if never)."""
        return now - self._first_seen.get(peer, now)

    def report_unreachable(self, reporter: str, target: str, now: float) -> None:
        """`reporter` could open no stream to `target`; corroborated, `target` is declared gone (once: later reports
        about a peer already declared gone change nothing)."""
        if target in self.declared_gone:
            return
        self._reports.report(reporter, target, now)
        self._judge(now)

    def answered(self, peer: str, now: float) -> None:
        """`peer` answered the scheduler's ping: alive now, whatever the reads say (see `UnreachableReports`)."""
        self._reports.answered(peer, now)
        self._answered_at[peer] = now

    def heard_from(self, peer: str, seqno: int, now: float) -> None:
        """A signed control message from `peer`, numbered `seqno` by its sidecar, came at `now`: alive now, as after
        an answer to a ping, if the number is above every one seen from it (anyone may re-publish an old message,
        nobody can make a new one: `Alive`). Its reports of each iteration (`Done`, `Pace`) so keep a peer whose DHT
        stores time out live without a ping. A peer with no record is not noted (a stranger's messages must not
        grow the table)."""
        if peer not in self.records or seqno <= self._numbers.get(peer, -1):
            return
        self._numbers[peer] = seqno
        self.answered(peer, now)

    def unanswered(self, peer: str, now: float) -> None:
        """The scheduler's ping to `peer` went unanswered: with a report about it, it is declared gone; missed by the
        reads, it is not asked again until it is heard from, and goes once its record's lifetime is out."""
        self._unanswered[peer] = now
        if peer not in self.declared_gone:
            self._reports.unanswered(peer, now)
            self._judge(now)

    def reporters(self, target: str, now: float) -> set[str]:
        """Peers that recently reported `target` unreachable."""
        return self._reports.reporters(target, now)

    def declare_gone(self, peer: str, why: str, now: float | None = None, *, witness: str) -> None:
        """Take `peer` for gone before its record expires (the next DHT read leaves it out); `witness` names what
        convinced the scheduler (`UnreachableReports.gone`'s, or `broken`, `faulty`)."""
        logger.warning("%s is gone: %s", peer, why, extra=event("declared_gone", peer=peer, why=why, witness=witness))
        self.declared_gone.add(peer)
        self._declared_at[peer] = self._now if now is None else now
        self._times_declared[peer] = self._times_declared.get(peer, 0) + 1
        self._reports.forget(peer)

    def take_back(self, peers: Collection[str], now: float, *, why: str) -> dict[str, PeerRecord]:
        """Take back those of `peers` declared gone that kept beating since (a record written after the declaration,
        live, not leaving) once their cool-down has passed (`rejoin_after`); returns them with their records.

        For when the run cannot go on without them: a peer declared gone learns it only from an epoch without it,
        and rejoins then; where no such epoch can be planned (every data holder gone), it never would. Each time it
        is declared again it waits longer, so a peer that really fails its neighbours is not placed on every try."""
        back = {}
        for p in peers:
            record = self.records.get(p)
            if p not in self.declared_gone or record is None or p in self._leaving or \
                    now - self._last_seen[p] > silent_after(self.heartbeat) or not self._written_after_declared(p) or \
                    not self._cooled_down(p, now):
                continue
            logger.warning("%s, declared gone %.0f s ago, is taken back: %s", p, now - self._declared_at[p], why,
                           extra=event("taken_back", peer=p, why=why))
            self.declared_gone.discard(p)
            self._reports.forget(p)
            back[p] = record
        return back

    def describe(self, peer: str, now: float) -> str:
        """Why `peer` is not live, or that it is, in a few words (for the log of a decision it blocks)."""
        if peer not in self.records:
            return "never seen"
        age = self._heartbeat_age[peer] + max(0.0, now - self._last_seen[peer])
        if peer in self.declared_gone:
            beating = "beating since" if self._written_after_declared(peer) else "silent since"
            return f"declared gone {now - self._declared_at[peer]:.0f} s ago, {beating} (heartbeat {age:.1f} s old)"
        if peer in self._leaving:
            return "left"
        if now - self._last_seen[peer] > silent_after(self.heartbeat):
            return f"no record read for {now - self._last_seen[peer]:.0f} s"
        return f"live (heartbeat {age:.1f} s old)"

    def _cooled_down(self, peer: str, now: float) -> bool:
        """Whether `peer`, declared gone, has waited its cool-down (`rejoin_after`) since."""
        return now - self._declared_at.get(peer, now) >= rejoin_after(self._times_declared.get(peer, 1))

    def _written_after_declared(self, peer: str) -> bool:
        """Whether `peer`'s newest record was written after it was declared gone: only such a record asks to be
        placed again (a peer that froze just after writing a joining record keeps showing that record)."""
        written = self._last_seen.get(peer, float("-inf")) - self._heartbeat_age.get(peer, float("inf"))
        return written > self._declared_at.get(peer, float("inf"))

    def _judge(self, now: float) -> None:
        """Declare gone the peers that corroborated reports show unreachable; take back those that rejoined."""
        self._now = max(self._now, now)
        for p in list(self.declared_gone):
            record = self.records.get(p)
            if record is None or record.state != PeerState.JOINING or not self._written_after_declared(p):
                continue
            if self._cooled_down(p, now):  # alive after all, and it asks to be placed
                logger.info("%s, declared gone %.0f s ago, asks to be placed again: taken back", p,
                            now - self._declared_at[p])
                self.declared_gone.discard(p)
                self._reports.forget(p)
        # a heartbeat's age as of now: what the newest read said, plus the time since (a silent peer's grows, also
        # while reads are slow); a record the newest read missed has no known age (that read, not the peer, failed)
        ages = {p: age + max(0.0, now - self._last_seen[p]) for p, age in self._heartbeat_age.items()
                if self._last_seen[p] >= self._last_read}
        for p, (witness, why) in self._reports.gone(ages, now).items():
            self.declare_gone(p, why, now, witness=witness)
