"""`Attempts`: one peer's record of its microbatches' attempts within one iteration.

A microbatch whose path broke (a peer on it died, or held it too long) is run again by its data holder as a new
`attempt`, around the peer it broke at. Each peer keeps which attempt of each microbatch is current, which
attempts are over here (a message of one is stale), which stages' gradients already hold each microbatch (they run
it again without accumulating), and, at a holder, which reports against a peer its new attempt is testing. The
decisions on these are pure functions of the bookkeeping; the executor acts on them (drops stashes, re-injects,
reports).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.detour import detour
from scheduler.schedule import Route, Schedule


@dataclass(frozen=True)
class Requeue:
    """A peer's report, for the data holder that injected `microbatch`: its `attempt` cannot finish because `gone`
    (a peer on its path) is gone."""

    iteration: int
    epoch: int
    microbatch: int
    attempt: int
    gone: str
    why: str = ""
    maybe_ran: bool = False
    """Whether `gone` may have run this attempt's backward (a send to it failed after it may have arrived): then
    its stage is taken to hold the microbatch already, lest a wrongly suspected peer's stage count it twice."""
    reporter: str | None = None
    """The peer whose report this is (None: this peer found it)."""


def requeued_route(schedule: Schedule, r: Route, report: Requeue, counted: frozenset[int], *, loss_done: bool,
                   gone: set[str]) -> tuple[Route | None, frozenset[int]]:
    """The route a re-queued microbatch takes around `gone` peers (None if no detour obeys the rules), and the
    stages whose gradient holds it already: those its backward passed after the loss, from the peer that broke it
    on (from that peer's stage too if it `maybe_ran` the backward); every stage if where it stopped is unknown."""
    counted = set(counted)
    if loss_done and report.gone in r.nodes[1:]:
        hop = r.nodes.index(report.gone)
        counted |= set(r.stages[hop - 1 if report.maybe_ran else hop:])
    elif loss_done:
        counted |= set(r.stages)
    new: Route | None = r
    for hop in range(1, len(r.nodes)):
        if new is not None and new.nodes[hop] in gone:
            new = detour(schedule, new, hop, gone)
    return new, frozenset(counted)


def peers_to_avoid(report: Requeue, me: str, on_path: tuple[str, ...]) -> list[set[str]]:
    """The peers a re-queued microbatch goes around, in order of preference: the peer it broke at; else, when a
    relay on its path (`on_path`) reported that and nothing can take that peer's place, the reporter. Its word may
    be a lie (a relay sitting on microbatches can blame the peer after it, alone on its stage, and the iteration
    would run again and again); going around the reporter instead tests it (`Attempts.disproved_by`)."""
    reporter = report.reporter
    if reporter is None or reporter == me or reporter not in on_path or reporter == report.gone:
        return [{report.gone}]
    return [{report.gone}, {reporter}]


class Attempts:
    """Which attempt of each microbatch is current on this peer, which are over, and what each one carries."""

    def __init__(self) -> None:
        self._current: dict[int, int] = {}
        """Microbatch -> its newest attempt this peer has seen (0 unless re-queued)."""
        self._over: set[tuple[int, int]] = set()
        """(microbatch, attempt) pairs that broke: their messages are stale here."""
        self._counted: dict[int, frozenset[int]] = {}
        """Microbatch -> the stages whose gradient already holds it (sent along by its holder)."""
        self._head_counted: set[int] = set()
        """This holder's microbatches whose loss (and head gradient) is already in the sums."""
        self._accused: dict[int, tuple[str, str, int]] = {}
        """This holder's microbatch -> (reporter, the peer it reported the attempt broken at, the new attempt that
        still goes through that peer)."""

    def current(self, microbatch: int) -> int:
        return self._current.get(microbatch, 0)

    def is_current(self, microbatch: int, attempt: int) -> bool:
        return attempt == self.current(microbatch)

    def is_over(self, microbatch: int, attempt: int) -> bool:
        return (microbatch, attempt) in self._over

    def over(self) -> set[tuple[int, int]]:
        """The attempts that broke here (read-only use: `AwaitedBackwards` skips them)."""
        return self._over

    def end(self, microbatch: int, attempt: int) -> bool:
        """Mark `attempt` of `microbatch` broken; False if it already was (act on a break once)."""
        if (microbatch, attempt) in self._over:
            return False
        self._over.add((microbatch, attempt))
        return True

    def stale(self, microbatch: int, attempt: int, *, mine: bool) -> bool:
        """A message of an attempt that is over here: an earlier one, one that broke, or (at its holder, the only
        peer that starts attempts) any but the current one."""
        current = self.current(microbatch)
        return attempt < current or (mine and attempt != current) or (microbatch, attempt) in self._over

    def arrived(self, microbatch: int, attempt: int) -> bool:
        """A message of `attempt` was admitted; True if it is newer than the current one (now current: what this
        peer holds of earlier attempts is stale)."""
        if attempt <= self.current(microbatch):
            return False
        self._current[microbatch] = attempt
        return True

    def counted(self, microbatch: int) -> frozenset[int]:
        """The stages whose gradient already holds `microbatch`."""
        return self._counted.get(microbatch, frozenset())

    def carry(self, microbatch: int, counted: tuple[int, ...]) -> None:
        """A forward brought the stages its holder says hold the microbatch already."""
        self._counted[microbatch] = frozenset(counted)

    def head_counted(self, microbatch: int) -> bool:
        """Whether this holder's loss of `microbatch` is already in the sums."""
        return microbatch in self._head_counted

    def count_head(self, microbatch: int) -> None:
        self._head_counted.add(microbatch)

    def begin(self, microbatch: int, attempt: int, counted: frozenset[int], *,
              accused: tuple[str, str] | None = None) -> None:
        """This holder starts `attempt`, whose stages in `counted` hold it already; `accused` = (reporter, peer)
        when the new attempt still goes through the peer a relay reported it broken at (it tests the word)."""
        self._current[microbatch] = attempt
        self._counted[microbatch] = counted
        if accused is not None:
            self._accused[microbatch] = (*accused, attempt)

    def disproved_by(self, r: Route) -> tuple[str, str, int] | None:
        """(reporter, accused, attempt) when this holder's microbatch reached its loss on an attempt testing a
        report and the accused peer served it: the report was false (or the reporter cannot reach that peer)."""
        accused = self._accused.get(r.microbatch)
        if accused is None or accused[2] != self.current(r.microbatch):
            return None
        del self._accused[r.microbatch]
        return accused if accused[1] in r.nodes else None
