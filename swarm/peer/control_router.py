"""`ControlRouter`: a peer's control messages (gossip), each to the component that handles it.

Everything goes to the peer's own scheduler role if it holds one. Then the message is decoded (a malformed one is
logged as an `ignored_control` event and dropped) and routed by kind and sender: admissions and refusals from the
scheduler (or its successor) to `Members`, the coordinator's dial-back verdict and a sit-out to `DialVerdict`, a
sit-out's or a bench's length to the `ScheduleFollower` (its wait to be placed again lasts that much longer), the
scheduler's notices to the `ScheduleFollower` (the main loop woken), a ping answered at once, from the gossip
thread (a busy main loop still answers), and a scheduled peer's report of a broken microbatch attempt to the main
loop (its holder's executor re-queues it, a relay drops what it keeps of it). Anything else is ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from swarm.control.gossip import GossipMessage
from swarm.control.messages import Admitted, Benched, Broken, NotDialable, Ping, Pong, Refused, SitOut, received
from swarm.events import event
from swarm.peer.attempts import Requeue
from swarm.peer.mailbox import Inbox
from swarm.peer.members import Members
from swarm.peer.reachability_notice import DialVerdict
from swarm.peer.reports import Reports
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.wire import WireError

logger = logging.getLogger(__name__)


class ControlRouter:
    """Routes the control messages of run `run_id` for peer `peer_id` (called from the gossip thread).

    :param coordinator: the coordinator's peer id (the only one whose dial-back verdict counts)
    :param role: the scheduler role this peer holds, or None
    """

    def __init__(self, peer_id: str, run_id: str, coordinator: str, *, follower: ScheduleFollower, members: Members,
                 dial_verdict: DialVerdict, reports: Reports, inbox: Inbox, role: Callable[[], Any]) -> None:
        self.peer_id, self.run_id, self.coordinator = peer_id, run_id, coordinator
        self.follower, self.members, self.dial_verdict = follower, members, dial_verdict
        self.reports, self.inbox, self._role = reports, inbox, role

    def route(self, msg: GossipMessage) -> None:
        role = self._role()
        if role is not None:
            role.deliver(msg)
        try:
            message = received(msg, self.run_id)
        except WireError as e:
            logger.warning("ignored a control message from %s: %s", msg.sender, e,
                           extra=event("ignored_control", sender=msg.sender, kind="malformed", why=str(e)))
            return
        trusted = self.follower.trusted(msg.sender)
        if isinstance(message, (Admitted, Refused)) and trusted:
            self.members.on_control(msg.sender, message)
        elif isinstance(message, NotDialable) and msg.sender == self.coordinator:
            self.dial_verdict.on_not_dialable(message)
        elif isinstance(message, (SitOut, Benched)) and message.peer == self.peer_id and trusted:
            self.follower.sit_out(message.seconds)
            if isinstance(message, SitOut):
                self.dial_verdict.on_sit_out(message)
            else:
                logger.warning("the scheduler takes this peer off the run's work for %.0f s from iteration %d: "
                               "its passes stayed far slower than the other peers' (is another job using this "
                               "machine?); it is placed again afterwards", message.seconds,
                               message.iteration, extra=event("benched", iteration=message.iteration,
                                                              seconds=message.seconds))
        elif isinstance(message, Ping) and message.peer == self.peer_id and trusted:
            self.reports.tell(Pong(nonce=message.nonce))
        elif self.follower.on_message(msg.sender, message, msg.seqno):
            self.inbox.wake()
        elif isinstance(message, Broken) and (schedule := self.follower.schedule) is not None and \
                msg.sender in schedule.placement:
            self.inbox.signal(Requeue(iteration=message.iteration, epoch=message.epoch,
                                      microbatch=message.microbatch, attempt=message.attempt, gone=message.gone,
                                      why=message.why, maybe_ran=message.maybe_ran, reporter=msg.sender))
