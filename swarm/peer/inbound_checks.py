"""`InboundChecks`: what a peer expects to receive, told to its transport before any buffer is allocated.

The transport asks `expects(sender, header)` for every message once its header is read: a pipeline message must
have the run's activation shape and come from the peer its schedule (or a valid detour) says sends it at that
hop; a stage-averaging message must come from a member of this peer's stage group. Stage state is taken only from
the peers named as its sources (`state_gate`), while this peer waits for it. The full check of a pipeline message
against the route in use (`hop_mismatch`) runs again when the executor takes it: this one keeps strangers' bytes
out of memory, that one keeps them out of the computation.

A joiner that knows no schedule yet takes what admitted members send it (the transport refuses everyone else):
the epoch that places it reaches its stage mates and the peers before it first, and what they send it before it
heard is held by its inbox until it adopts that epoch. Refused, their averages would never come again.

Stale or early messages are not refused here: a refusal goes back to the sender as undelivered, and its executor
would report a microbatch broken; the inbox drops those quietly instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from scheduler.schedule import Schedule
from swarm.net.delivery import Inbound
from swarm.net.receive_limits import StateGate, all_of, pipeline_shape
from swarm.peer.hop_check import hop_mismatch
from swarm.wire import Direction, HopHeader


class InboundChecks:
    """The checks of peer `me` of run `run_id`, over the schedules it knows (`schedules()`: the one in use and
    those read and not started yet). `expects` is called on the transport's event loop: it only reads."""

    def __init__(self, me: str, run_id: str, activation_shape: tuple[int, ...],
                 schedules: Callable[[], Iterable[Schedule | None]]) -> None:
        self.me, self.run_id, self._schedules = me, run_id, schedules
        self.state_gate = StateGate()
        self.expects = all_of(pipeline_shape(activation_shape), self._expected)
        self._routes: tuple[Schedule | None, dict] = (None, {})
        """The routes by microbatch of the schedule last checked against (one lookup per message, not a scan)."""

    def expect_state(self, peers: Iterable[str]) -> None:
        """This peer waits for its stage's state from `peers`."""
        self.state_gate.expect(peers)

    def online(self) -> None:
        """This peer holds its stage's state: it takes none from anyone."""
        self.state_gate.forget()

    def _expected(self, sender: str, h: HopHeader) -> str | None:
        if h.direction == Direction.STATE:
            return None  # the state gate decides
        known = [s for s in self._schedules() if s is not None]
        if not known:
            return None  # a joiner not placed yet: its placement's first messages can come first; its inbox holds them
        schedule = next((s for s in known if s.epoch == h.epoch), None)
        if schedule is None:  # an epoch newer than any known (its sender adopted it first): a placed peer at least
            newest = max(known, key=lambda s: s.epoch, default=None)
            if newest is not None and h.epoch > newest.epoch and sender in newest.placement:
                return None
            return f"schedule epoch {h.epoch} is not one this peer knows"
        if h.direction == Direction.AVERAGE:
            mine = schedule.placement.get(self.me)
            if mine is None or schedule.placement.get(sender) != mine:
                return f"{sender} is not in this peer's stage group under epoch {h.epoch}"
            return None
        if self._routes[0] is not schedule:
            self._routes = (schedule, {r.microbatch: r for r in schedule.routes})
        routes = self._routes[1]
        return hop_mismatch(Inbound(sender, h, torch.empty(0)), schedule=schedule, routes=routes, in_use=routes,
                            run_id=self.run_id, iteration=h.iteration, me=self.me, check_backward_prefix=False)
