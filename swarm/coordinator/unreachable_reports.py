"""`UnreachableReports`: peers' reports that no stream to a peer could be opened, turned into a verdict.

Heartbeat expiry alone takes three heartbeats (plus a grace) to notice a dead peer, and until then the scheduler
keeps planning it in. The peers that send to it notice first: the transport cannot open a stream. One such report
is not proof (one broken link, a busy peer), so the scheduler declares the peer gone early only when it is
corroborated: two different reporters; or one reporter and the scheduler's own witness, a ping over gossip that
the peer did not answer (`swarm.coordinator.pings`); or one reporter while the peer's own heartbeat is overdue
(an answer to a ping counts as a heartbeat: alive, its DHT slow). The ping is what tells a silent death from a slow DHT
within seconds when heartbeats are long (a loaded swarm beats every 15 s: overdue only after ~40 s).
"""

from __future__ import annotations

from collections.abc import Mapping

REPORTS_VALID_HEARTBEATS = 3.0
"""A report counts for this many heartbeat periods."""
OVERDUE_HEARTBEATS = 2.5
"""A heartbeat older than this many periods is overdue. A live peer refreshes its record every period, and a store
may take up to a period and fail: one failed beat leaves the record two periods and a store old, which a loaded
machine sees now and then; only a second missed beat makes it overdue."""


class UnreachableReports:
    """Who could not reach whom, and since when; `gone` says which peers to declare gone now."""

    def __init__(self, heartbeat: float) -> None:
        self.heartbeat = heartbeat
        self._reports: dict[str, dict[str, float]] = {}
        """Target -> reporter -> time of its latest report."""
        self._answered: dict[str, float] = {}
        """Target -> when it last answered the scheduler's ping."""
        self._silent: dict[str, float] = {}
        """Target -> when the scheduler's ping to it went unanswered (forgotten once it answers one)."""

    def report(self, reporter: str, target: str, now: float) -> None:
        if reporter != target:
            self._reports.setdefault(target, {})[reporter] = now

    def answered(self, target: str, now: float) -> None:
        """`target` answered the scheduler's ping: it is alive, as if it had just beaten (its DHT may be slow)."""
        self._answered[target] = now
        self._silent.pop(target, None)

    def unanswered(self, target: str, now: float) -> None:
        """The scheduler's ping to `target` went unanswered: a witness of its own to a report."""
        self._silent[target] = now

    def forget(self, peer: str) -> None:
        """Drop the reports about `peer` (declared gone, or back) and its own (a gone peer's word no longer counts)."""
        self._reports.pop(peer, None)
        self._answered.pop(peer, None)
        self._silent.pop(peer, None)
        for reporters in self._reports.values():
            reporters.pop(peer, None)

    def reporters(self, target: str, now: float) -> set[str]:
        """Peers whose report about `target` is still valid."""
        valid = REPORTS_VALID_HEARTBEATS * self.heartbeat
        return {r for r, t in self._reports.get(target, {}).items() if now - t <= valid}

    def gone(self, heartbeat_age: Mapping[str, float], now: float) -> dict[str, tuple[str, str]]:
        """Targets to declare gone now, each with (the witness that corroborated the first report: `reporters`,
        `ping` or `heartbeat`; why).

        :param heartbeat_age: seconds since each peer's latest heartbeat (unknown for a peer missing from it: its
          record will expire on its own)
        """
        out = {}
        for target in list(self._reports):
            who = self.reporters(target, now)
            if not who:
                del self._reports[target]
                continue
            age = heartbeat_age.get(target)
            if age is not None and target in self._answered:  # an answer to a ping is as good as a heartbeat
                age = min(age, now - self._answered[target])
            times = [self._reports[target][r] for r in who]
            if len(who) >= 2:
                out[target] = ("reporters", f"unreachable from {len(who)} peers ({', '.join(sorted(who)[:3])})")
            elif self._silent.get(target, -1.0) >= min(times):  # a ping sent for this report went unanswered
                out[target] = ("ping", f"unreachable from {next(iter(who))}, and it did not answer a ping")
            elif age is not None and age > OVERDUE_HEARTBEATS * self.heartbeat:
                out[target] = ("heartbeat", f"unreachable from {next(iter(who))} and its heartbeat is {age:.1f} s old")
        return out
