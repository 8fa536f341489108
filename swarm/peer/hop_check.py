"""`hop_mismatch`: whether a pipeline message fits the schedule, before this peer computes anything with it.

A message must belong to this run, iteration and schedule epoch; its microbatch must be scheduled; its route must be
the scheduled one, the detour this peer last saw, or a detour the path rules allow (the stages travel with it);
it must be addressed to this peer at this hop; and it must come from the peer the route says sends it: the
previous hop for a forward, the next for a backward.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.detour import detour_violation
from scheduler.schedule import Route, Schedule
from swarm.net.delivery import Inbound
from swarm.wire import Direction


def hop_mismatch(m: Inbound, *, schedule: Schedule, routes: Mapping[int, Route], in_use: Mapping[int, Route],
                 run_id: str, iteration: int, me: str, check_backward_prefix: bool = True) -> str | None:
    """Why `m` does not fit `schedule` at peer `me` (None when it does).

    :param routes: the schedule's routes by microbatch
    :param in_use: each scheduled microbatch's route as this peer last saw it (the scheduled one, or a detour)
    :param check_backward_prefix: whether a backward must have come the way its forward went (only known once
      `in_use` holds the detours this peer saw)
    """
    h = m.header
    scheduled = routes.get(h.microbatch)
    if h.run != run_id or h.iteration != iteration:
        return f"run {h.run!r} iteration {h.iteration}, expected {run_id!r} iteration {iteration}"
    if h.epoch != schedule.epoch:
        return f"schedule epoch {h.epoch}, this iteration runs epoch {schedule.epoch}"
    if scheduled is None:
        return "no such microbatch in the schedule"
    r = in_use[h.microbatch]
    nodes, stages = tuple(h.route), tuple(h.stages[1:])
    if nodes != r.nodes or (h.stages and stages != r.stages):
        if not h.stages or h.stages[0] != 0:
            return "route differs from the schedule and carries no stages"
        why = detour_violation(schedule, scheduled, nodes, stages)
        if why is not None:
            return f"route or stages differ from the schedule and are no detour of it: {why}"
        if check_backward_prefix and h.direction == Direction.BACKWARD and (nodes[:h.hop + 1] != r.nodes[:h.hop + 1] or
                                                  stages[:h.hop] != r.stages[:h.hop]):
            return "backward's route up to this peer differs from the one its forward came by"
    if h.route[h.hop] != me:
        return f"hop {h.hop} is not this peer"
    last = len(nodes) - 1
    if h.direction == Direction.FORWARD:
        expected_sender = nodes[last] if h.hop == 0 else nodes[h.hop - 1]
    elif h.direction == Direction.BACKWARD:
        expected_sender = nodes[0] if h.hop == last else nodes[h.hop + 1]
    else:
        return f"direction {h.direction.name} is not a pipeline message"
    if m.sender != expected_sender:
        return f"sent by {m.sender}, the schedule says {expected_sender}"
    return None
