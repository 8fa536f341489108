"""`Reports`: what a peer tells its scheduler about the iteration in progress.

Each report is a typed control message gossiped to the run; a peer that holds the scheduler role itself also hands
it to its own role (gossip does not deliver a peer's own messages back to it). A peer reports another one
unreachable once per epoch: the scheduler corroborates such reports before it acts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from swarm.control.gossip import GossipClient
from swarm.control.messages import (
    Broken,
    ControlMessage,
    Done,
    Faulty,
    Pace,
    Stuck,
    Unreachable,
    Unrecoverable,
    as_gossip,
    publish,
)
from swarm.peer.attempts import Requeue
from swarm.peer.iteration_result import IterationResult

logger = logging.getLogger(__name__)

MAX_WHY_CHARS = 200


class Reports:
    """Reports of peer `peer_id` in run `run_id`.

    :param gossip: returns the gossip client (None before it starts or after it stops: reports are dropped)
    :param own_role: returns this peer's scheduler role, if it holds it
    """

    def __init__(self, peer_id: str, run_id: str, gossip: Callable[[], GossipClient | None],
                 own_role: Callable[[], Any]) -> None:
        self.peer_id, self.run_id = peer_id, run_id
        self._gossip, self._own_role = gossip, own_role
        self._unreachable: set[str] = set()

    def tell(self, message: ControlMessage) -> None:
        gossip = self._gossip()
        if gossip is None:
            return
        publish(gossip, self.run_id, message, wait=False)
        role = self._own_role()
        if role is not None:
            role.deliver(as_gossip(message, self.run_id, self.peer_id))

    def new_epoch(self) -> None:
        """A new epoch is in use: a peer still unreachable is reported again."""
        self._unreachable = set()

    def unreachable(self, peer: str) -> None:
        """`peer` cannot be reached from here (once per peer and epoch)."""
        if peer not in self._unreachable and self._gossip() is not None:
            self._unreachable.add(peer)
            self.tell(Unreachable(peer=peer))

    def stuck(self, iteration: int, epoch: int) -> None:
        """This peer's part of the iteration passed its deadline (the scheduler reruns it if nobody died)."""
        self.tell(Stuck(peer=self.peer_id, iteration=iteration, epoch=epoch))

    def broken(self, report: Requeue) -> None:
        """An attempt of another holder's microbatch cannot finish here: its holder re-queues it, and the scheduler
        takes the gone peer out."""
        self.tell(Broken(peer=self.peer_id, iteration=report.iteration, epoch=report.epoch,
                         microbatch=report.microbatch, attempt=report.attempt, gone=report.gone,
                         maybe_ran=report.maybe_ran, why=report.why[:MAX_WHY_CHARS]))

    def unrecoverable(self, iteration: int, epoch: int, microbatch: int, why: str) -> None:
        """This holder cannot re-queue a microbatch: the scheduler runs the iteration again."""
        self.tell(Unrecoverable(peer=self.peer_id, iteration=iteration, epoch=epoch, microbatch=microbatch,
                                why=why[:MAX_WHY_CHARS]))

    def faulty(self, suspect: str, iteration: int, epoch: int, why: str) -> None:
        """`suspect`'s averaging contribution of the iteration was refused as proof of a fault."""
        self.tell(Faulty(peer=self.peer_id, suspect=suspect, iteration=iteration, epoch=epoch,
                         why=why[:MAX_WHY_CHARS]))

    def done(self, iteration: int, epoch: int, result: IterationResult, shards: dict, *, operations: int = 0,
             compute: float = 0.0) -> None:
        """This data holder finished its microbatches of the iteration (`operations` passes computed in `compute`
        seconds)."""
        self.tell(Done(peer=self.peer_id, iteration=iteration, epoch=epoch, loss_sum=result.loss_sum,
                       losses=result.losses, tokens=result.tokens, started=result.started, finished=time.time(),
                       dropped=result.dropped, shards=shards, operations=operations, compute=round(compute, 4)))

    def pace(self, iteration: int, epoch: int, operations: int, compute: float) -> None:
        """This relay computed `operations` passes of the iteration in `compute` seconds (none: nothing to say)."""
        if operations > 0:
            self.tell(Pace(peer=self.peer_id, iteration=iteration, epoch=epoch, operations=operations,
                           compute=round(compute, 4)))
