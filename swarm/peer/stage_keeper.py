"""`StageKeeper`: which stage a peer serves, with which state, and the state it hands to others.

It holds the peer's `StageSession` and moves it through the schedule's placements: the first placement (a session
from the run's seed or its initial checkpoint, or from a same-stage peer's state for a joiner, or a restarted
stage's), a move to another stage (a new session, its state from the peer the schedule names), equipping the
newcomers of its own stage, and the hand-over of a stage whose last peer leaves. Stage state travels as two STATE
messages through the peer's inbox and outbox (`swarm.stage_group.state_transfer`); a joiner loads a state whose
digest two veterans of its stage agree on, where it has two.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from concurrent.futures import Future

import torch
from hivemind import DHT

from peers.checkpoint import load_stage_tensors
from peers.model import ModelConfig
from peers.precision import peer_precision
from peers.stage import neighbour_blocks
from peers.worker import StageWorker, WorkerError
from scheduler.schedule import Schedule
from swarm.events import event
from swarm.net.delivery import Inbound
from swarm.peer.inbound_checks import InboundChecks
from swarm.peer.mailbox import Inbox, Outbox
from swarm.peer.members import NotAdmitted
from swarm.peer.options import PeerOptions
from swarm.peer.stage_session import (
    StageSession,
    check_initial_weights,
    new_worker,
    receive_state,
    restart_stage,
    restore_source,
    start_from_initial_weights,
)
from swarm.run_config import RunConfig
from swarm.stage_group.state_transfer import (
    load_state,
    receive_agreed_state,
    send_digest,
    send_state,
    state_senders,
)
from swarm.wire import Direction, HopHeader, PeerState

logger = logging.getLogger(__name__)

STATE_TIMEOUT = PeerOptions.state_timeout
"""Seconds a joiner waits for its stage's state from a same-stage peer (`--state-timeout`)."""
HANDOVER_TIMEOUT = 60.0
"""Seconds a peer moved to another stage waits for the state of the peer it replaces (and a leaving peer for its
hand-over to be delivered)."""


class PrecisionRefused(NotAdmitted):
    """This peer's device or `--precision` cannot compute in the run's `train.precision`."""


class JoinAbandoned(Exception):
    """A joiner cannot take up its placement: its stage's state did not come (`revised` False: the peer leaves the
    placement, to be placed afresh), or a newer epoch re-plans its first iteration with it elsewhere or without it
    (`revised` True: the peer starts on that epoch instead). Either way the peer stays in the run."""

    def __init__(self, why: str, *, revised: bool) -> None:
        super().__init__(why)
        self.revised = revised


class StageKeeper:
    """Peer `peer_id`'s stage. `stage` is what it announces (-1, or the stage it pins, until placed).

    :param loss_seconds: this device's measured loss step (a paced worker pads to it)
    :param dht: returns the peer's DHT (for its stage group's hivemind averager)
    :param checks: the transport's checks, told whom stage state is expected from while this peer waits for it
    :param state_timeout: seconds a joiner waits for its stage's state (`STATE_TIMEOUT`)
    :param gone: the peers the scheduler declared gone: a moved or restarting peer stops waiting for the state of a
      source among them (it would wait out `HANDOVER_TIMEOUT` or `state_timeout` for nothing, its stage unserved)
    :raises InitialWeightsRefused: the peer's --init-from does not hold the run's initial weights
    """

    def __init__(self, peer_id: str, options: PeerOptions, config: RunConfig, model_config: ModelConfig, *,
                 inbox: Inbox, outbox: Outbox, dht: Callable[[], DHT], loss_seconds: float,
                 checks: InboundChecks | None = None, state_timeout: float = STATE_TIMEOUT,
                 gone: Callable[[], Collection[str]] = frozenset) -> None:
        self.peer_id, self.options, self.config, self.model_config = peer_id, options, config, model_config
        self.inbox, self.outbox, self._dht, self.loss_seconds = inbox, outbox, dht, loss_seconds
        self.checks, self.state_timeout, self._gone = checks, state_timeout, gone
        self._equipped: dict[str, tuple[int, int]] = {}
        """Peer -> (stage, step) of the state (or digest) this peer sent it, while not known undelivered: a re-plan
        from the same iteration names the same joiners again, and they hold that state already."""
        self.stage = -1 if options.stage is None else options.stage  # announced: the planner pins it there
        self.state = PeerState.JOINING
        self.session: StageSession | None = None
        check_initial_weights(options.init_from, config, model_config)
        try:  # refused on joining, not after placement: a CPU peer in a bf16 run, say
            self.precision = peer_precision(config.train.precision, options.precision, options.device)
        except ValueError as e:
            raise PrecisionRefused(f"this peer cannot compute as the run does: {e}") from None

    @property
    def worker(self) -> StageWorker | None:
        return self.session.worker if self.session is not None else None

    def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def start(self, schedule: Schedule, iteration: int, *,
              revised: Callable[[], Schedule | None] = lambda: None) -> None:
        """Placed by `schedule` from `iteration` (first placement, or placed again after being dropped): a session
        from the seed, or from a same-stage peer's state (or a restarted stage's) for a joiner.

        A joiner waiting for its stage's state follows `revised` (the newest epoch known): an epoch that reruns
        `iteration` names the veterans to hear from. Raises `JoinAbandoned` when the state does not come in time or
        such an epoch places this peer otherwise; the session is dropped then (it holds no state of the stage)."""
        joiner = self.peer_id in schedule.meta.get("joiners", ()) or self.session is None
        if self.session is not None and schedule.placement[self.peer_id] != self.stage:
            self.session.close()
            self.session = None
        self.stage = schedule.placement[self.peer_id]
        if self.session is None:
            self.session = self._new_session(schedule)
            if iteration == 0 and self.config.init_weights:
                start_from_initial_weights(self.worker, self.options.init_from, self.config)
        self.worker.reset()
        if iteration > 0 and joiner:
            try:
                self._load_stage(schedule, iteration, revised)
            except (TimeoutError, WorkerError, JoinAbandoned) as e:
                self.session.close()  # it holds no state of the stage: whatever places this peer next, it joins
                self.session = None
                if isinstance(e, JoinAbandoned):
                    raise
                raise JoinAbandoned(f"stage {self.stage}'s state did not come: {e}", revised=False) from None
            self.session.lineage = b""  # a copy of the group's state now, not of its own rounds before it was dropped
        self._go_online()

    def _load_stage(self, schedule: Schedule, iteration: int, revised: Callable[[], Schedule | None]) -> None:
        """A joiner's state of its stage: restarted from the source the scheduler names, or a state its veterans
        agree on (those of the newest epoch that reruns `iteration` and still places this peer so)."""
        source = restore_source(schedule, self.peer_id)
        if source is not None:
            self._restart(schedule, source)
            return
        current = schedule

        def electorate() -> tuple[list[str], int]:
            nonlocal current
            later = revised()
            if later is not None and later.epoch > current.epoch and \
                    int(later.meta.get("start_iteration", 0)) <= iteration:
                if later.placement.get(self.peer_id) != self.stage or restore_source(later, self.peer_id) or \
                        self.peer_id not in later.meta.get("joiners", ()):
                    raise JoinAbandoned(f"epoch {later.epoch} places this peer otherwise", revised=True)
                current = later
            senders = state_senders(current, self.stage)
            if not senders:
                raise TimeoutError(f"epoch {current.epoch} names no veteran of stage {self.stage} to send it")
            self._expect_state(senders)
            return senders, min(len(senders), self._voices())

        senders, needed = electorate()
        parts = receive_agreed_state(self.worker, lambda t: self.inbox.receive("state", t, any_iteration=True),
                                     senders=senders, needed=needed, timeout=self.state_timeout, electorate=electorate,
                                     progress=lambda: self.inbox.assembly.arrived[Direction.STATE])
        steps = load_state(self.worker, parts)
        logger.info("loaded stage %d's state (step %d) from a same-stage peer", self.stage, steps,
                    extra=event("stage_loaded", stage=self.stage, source="peer", steps=steps))

    def move(self, schedule: Schedule, source: str, *, restart: bool = False) -> None:
        """The scheduler moved this peer to another stage, to take its state over from `source`: that stage's last
        peer leaving gracefully, or a peer staying on it (the move refills a group a departure shrank). With
        `restart`, nobody has the stage any more and `source` is a peer of a neighbouring stage (a full pipeline
        cannot skip the stage): it restarts as a joiner of an emptied stage does. Should the state not come, the
        stage restarts from this peer's own blocks (as a stage that lost every peer restarts from a neighbour's)."""
        old, old_stage = self.session, self.stage
        self.stage, self.state = schedule.placement[self.peer_id], PeerState.JOINING
        self.inbox.online = False
        old.close()  # its averaging group was the old stage's
        self.session = self._new_session(schedule)
        try:
            if restart:
                self._restart(schedule, source)
                logger.warning("moved from stage %d to stage %d, which had no peer left", old_stage, self.stage,
                               extra=event("moved", from_stage=old_stage, to_stage=self.stage, source=source,
                                           restart=True))
            else:
                steps = load_state(self.worker, self._receive_state(schedule, source, HANDOVER_TIMEOUT))
                logger.warning("moved from stage %d to stage %d: took over its state (step %d) from %s", old_stage,
                               self.stage, steps, source,
                               extra=event("stage_loaded", stage=self.stage, source="handover", peer=source,
                                           steps=steps, from_stage=old_stage))
        except (TimeoutError, WorkerError) as e:
            load_stage_tensors(self.worker, neighbour_blocks(self.worker.module, old.worker.module.state_dict()), {},
                               steps=old.worker.steps)
            logger.warning("moved from stage %d to stage %d, but %s's state did not come (%s): initialised it from "
                           "this peer's stage %d blocks", old_stage, self.stage, source, e, old_stage,
                           extra=event("stage_loaded", stage=self.stage, source="own_blocks", peer=self.peer_id,
                                       from_stage=old_stage))
        self._go_online()

    def equip(self, schedule: Schedule, old: Schedule, iteration: int) -> None:
        """Send this stage's state to the peers new to it that this peer is to equip: the first veteran of a stage
        equips its joiners; the scheduler names who equips a moved peer and a restarted stage."""
        joiners = set(schedule.meta.get("joiners", ()))
        handover = schedule.meta.get("handover")
        handover = handover if isinstance(handover, dict) else {}
        newcomers = [p for p in schedule.stage_peers(self.stage) if p in joiners]
        veterans = [p for p in state_senders(schedule, self.stage) if p in old.placement]
        voices = self._voices()
        if voices > 1 and self.peer_id in veterans[voices:]:  # vouches for the state the first veterans send
            for peer in newcomers:
                if self._first_send(peer, old):
                    send_digest(me=self.peer_id, worker=self.worker, to=peer, run_id=self.options.run_id,
                                iteration=iteration, epoch=schedule.epoch, send=self._sender(peer))
        receivers = newcomers if self.peer_id in veterans[:voices] else []
        receivers += [p for p, src in handover.items() if src == self.peer_id and p in schedule.placement
                      and p not in receivers]
        receivers += [p for p in schedule.placement if p != self.peer_id and p not in receivers
                      and restore_source(schedule, p) == self.peer_id]
        for peer in receivers:
            if not self._first_send(peer, old):
                logger.info("stage %d's state (step %d) went to %s already", self.stage, self.worker.steps, peer)
                continue
            send_state(me=self.peer_id, worker=self.worker, to=peer, run_id=self.options.run_id,
                       iteration=iteration, epoch=schedule.epoch, send=self._sender(peer))
            why = "joining" if peer in joiners else "moving"
            logger.info("sent stage %d's state to %s peer %s (stage %d)", self.stage, why, peer,
                        schedule.placement.get(peer, -1),
                        extra=event("state_sent", stage=self.stage, to=peer, why=why))

    def hand_over(self, schedule: Schedule, iteration: int) -> None:
        """`schedule` plans without this draining or benched peer: if it was its stage's last, send the stage's state
        to the peer moved there to take over (the schedule names it)."""
        handover = schedule.meta.get("handover")
        takers = [p for p, source in handover.items() if source == self.peer_id and p in schedule.placement] \
            if isinstance(handover, dict) else []
        sent: list[Future[bool]] = []
        for peer in takers:
            send_state(me=self.peer_id, worker=self.worker, to=peer, run_id=self.options.run_id,
                       iteration=iteration, epoch=schedule.epoch, send=lambda *a: sent.append(self.outbox.send(*a)))
        try:
            delivered = all(f.result(timeout=HANDOVER_TIMEOUT) for f in sent)
        except TimeoutError:
            delivered = False
        if takers:
            logger.info("handed stage %d's state (step %d) over to %s%s", self.stage, self.worker.steps,
                        ", ".join(takers), "" if delivered else " (not delivered: it restarts from its own blocks)",
                        extra=event("state_sent", stage=self.stage, to=takers, why="handover", delivered=delivered))

    def _first_send(self, peer: str, old: Schedule) -> bool:
        """Whether this stage's state as it is now has not gone to `peer` yet, while `peer` stayed on the stage
        (`old` placed it there: not a peer that left and came back); if so, it is noted as sent. A peer that holds
        it refuses a copy only after `STATE_ADMISSION_WAIT` per part: a copy sent again would keep a sender thread
        of this peer's busy that long for nothing."""
        now = (self.stage, self.worker.steps)
        if self._equipped.get(peer) == now and old.placement.get(peer) == self.stage:
            return False
        self._equipped[peer] = now
        return True

    def _sender(self, peer: str) -> Callable[[str, HopHeader, torch.Tensor], Future[bool]]:
        """`outbox.send`, forgetting that `peer` was equipped if a part is not delivered (the next epoch that names
        it sends again)."""
        noted = self._equipped.get(peer)

        def forget_unless_delivered(future: Future[bool]) -> None:
            if future.cancelled() or future.exception() is not None or not future.result():
                if self._equipped.get(peer) == noted:
                    self._equipped.pop(peer, None)

        def send(to: str, header: HopHeader, tensor: torch.Tensor) -> Future[bool]:
            future = self.outbox.send(to, header, tensor)
            future.add_done_callback(forget_unless_delivered)
            return future

        return send

    def _new_session(self, schedule: Schedule) -> StageSession:
        """A fresh session for this peer's stage in `schedule`, its worker from the run's seed."""
        o = self.options
        drift = o.emulate_drift if o.emulate_seconds_per_layer else 1.0  # only an emulated device drifts
        emulated = o.emulate_seconds_per_layer and o.emulate_seconds_per_layer * drift
        worker = new_worker(self.peer_id, self.stage, schedule, self.model_config, self.config, device=o.device,
                            precision=self.precision, emulate_seconds_per_layer=emulated,
                            loss_seconds=self.loss_seconds * drift)
        return StageSession(self.stage, worker, run_id=o.run_id, dht=self._dht)

    def _voices(self) -> int:
        """Veterans whose digests a joiner needs to agree: two, unless hivemind's averager keeps the members' states
        equal only up to rounding."""
        return 1 if self.config.averaging == "hivemind" else 2

    def _receive_state(self, schedule: Schedule, source: str | None, timeout: float) -> dict[int, Inbound]:
        senders = [source] if source is not None else state_senders(schedule, self.stage)
        return receive_state(self.inbox, schedule, self.stage, source, timeout,
                             expect=lambda: self._expect_state(senders), source_gone=lambda: source in self._gone())

    def _expect_state(self, peers: list[str]) -> None:
        if self.checks is not None:
            self.checks.expect_state(peers)

    def _restart(self, schedule: Schedule, source: str) -> None:
        restart_stage(self.worker, self.stage, schedule, self.model_config, source=source,
                      source_stage=schedule.placement[source], checkpoint_dir=self.options.checkpoint_dir,
                      receive=lambda: self._receive_state(schedule, source, self.state_timeout))

    def _go_online(self) -> None:
        if self.checks is not None:
            self.checks.online()
        self.state = PeerState.ONLINE
        self.inbox.online = True
        self.inbox.drop_state()  # e.g. a neighbour's blocks not needed after all
