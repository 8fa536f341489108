"""`AwaitedBackwards`: the forwards a peer sent whose backward it still waits for, and which of them are late.

A peer that sends a microbatch's forward keeps its activations until the backward returns from the peer it sent
to. That peer is in question until then: if it turns out gone once the forward was delivered, the microbatch cannot
come back (its activations died with it); if the backward is late past the hop's deadline (the plan's round trip,
`scheduler.round_trips`, scaled to measured times), the peer checks on the next hop, once per attempt. A next hop
that answers that check but still holds the microbatch past a longer stall limit is holding the iteration up (a
relay stuck on its own troubles, or one that sits on work on purpose): its attempt is given up on, once, and the
microbatch goes around it (`stalled`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future

logger = logging.getLogger(__name__)


class AwaitedBackwards:
    """Microbatch -> (the peer its forward went to, that send, the attempt, when).

    :param hop_deadlines: microbatch -> seconds after its forward left by which its backward should be back
    :param overdue: told (peer, microbatch) once per attempt whose backward is past its deadline
    :param stall_limits: microbatch -> seconds after its forward left past which a backward still not back is
      given up on (`stalled`); none: never
    :param round_trip: told (microbatch, seconds) of each first attempt's backward back from where its forward went
      (the scheduled path's round trip as measured, for later deadlines)
    """

    def __init__(self, hop_deadlines: Mapping[int, float] | None = None,
                 overdue: Callable[[str, int], None] | None = None,
                 stall_limits: Mapping[int, float] | None = None,
                 round_trip: Callable[[int, float], None] | None = None) -> None:
        self.hop_deadlines, self.on_overdue = dict(hop_deadlines or {}), overdue
        self.stall_limits = dict(stall_limits or {})
        self.on_round_trip = round_trip
        self._awaiting: dict[int, tuple[str, Future[bool] | None, int, float]] = {}
        self._told: set[tuple[int, int]] = set()
        self._stalled: set[tuple[int, int]] = set()

    def sent(self, microbatch: int, peer: str, send: Future[bool] | None, attempt: int) -> None:
        """The forward of `attempt` of `microbatch` went to `peer` (`send` resolves to whether it was delivered;
        None: delivered)."""
        self._awaiting[microbatch] = (peer, send, attempt, time.monotonic())

    def returned(self, microbatch: int, sender: str, attempt: int) -> None:
        """A backward came from `sender`: if it is the awaited one, that peer is no longer in question."""
        awaited = self._awaiting.get(microbatch)
        if awaited is not None and awaited[0] == sender and awaited[2] == attempt:
            del self._awaiting[microbatch]
            if attempt == 0 and self.on_round_trip is not None:
                self.on_round_trip(microbatch, time.monotonic() - awaited[3])

    def forget(self, microbatch: int) -> None:
        self._awaiting.pop(microbatch, None)

    def lost_to(self, gone: Collection[str]) -> list[tuple[int, str, int]]:
        """(microbatch, peer, attempt) of forwards delivered to a peer now `gone`: their backward cannot come."""
        out = []
        for mb, (peer, sent, attempt, _) in list(self._awaiting.items()):
            delivered = sent is None or (sent.done() and sent.exception() is None and sent.result() is True)
            if peer in gone and delivered:
                out.append((mb, peer, attempt))
        return out

    def check_overdue(self, skip: Collection[tuple[int, int]] = (), iteration: int = 0) -> None:
        """Tell of backward passes late past their deadline, once per (microbatch, attempt) not in `skip`."""
        if self.on_overdue is None or not self.hop_deadlines:
            return
        now = time.monotonic()
        for mb, (peer, _, attempt, since) in list(self._awaiting.items()):
            limit, key = self.hop_deadlines.get(mb), (mb, attempt)
            if limit is not None and key not in self._told and key not in skip and now - since > limit:
                self._told.add(key)
                logger.warning("iteration %d: the backward of microbatch %d is %.1f s late from %s (deadline %.1f s)",
                               iteration, mb, now - since - limit, peer, limit)
                self.on_overdue(peer, mb)

    def stalled(self, skip: Collection[tuple[int, int]] = ()) -> list[tuple[int, str, int, float]]:
        """(microbatch, peer, attempt, seconds waited) of forwards whose backward is past its stall limit, each
        (microbatch, attempt) not in `skip` once."""
        now, out = time.monotonic(), []
        for mb, (peer, _, attempt, since) in list(self._awaiting.items()):
            limit, key = self.stall_limits.get(mb), (mb, attempt)
            if limit is not None and key not in self._stalled and key not in skip and now - since > limit:
                self._stalled.add(key)
                out.append((mb, peer, attempt, now - since))
        return out
