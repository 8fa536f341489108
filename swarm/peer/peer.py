"""`Peer`: a volunteer's process in a run, from joining to leaving.

Joins the DHT through any known peer, reads the signed run spec, measures its own compute speed and its links to a
sample of peers, and announces itself (a signed record refreshed by heartbeat). Once the scheduler's schedule
places it, it builds a `StageSession` for its stage: from the run's seed at the start, or from a same-stage peer's
weights and optimizer state when it joins mid-run. Then it loops over iterations (`IterationRunner`), adopting
each new schedule epoch as it becomes due (`ScheduleFollower`); a move to another stage builds a new session.

Iterations are atomic: a microbatch that lost a peer on its path is re-queued by its holder within the iteration;
a data holder that died is left out of the commit (a holder that sees itself left out puts its draws back); when
that cannot work (no holder left, no detour), the scheduler publishes an epoch that
starts at the uncommitted iteration; every peer abandons it (gradients dropped, data holders requeue their draws
and rewind), adopts the new epoch and runs the iteration again, so no sample is lost or trained twice.
Asked to stop, a placed peer drains: it serves until the scheduler plans without it (handing its stage's state to
a peer moved there if it was the stage's last), then announces that it leaves and shuts down.

The peer's other jobs each have their component: `Node` (DHT, records, gossip, heartbeat, reaper), `Inbox` and
`Outbox` (bounded), `LinkWatch`, `Succession` (the scheduler's watch and its role), `Reports`, `DataHolder`,
`ControlRouter` (gossip to whichever of them handles it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from peers.device_speed import announced_speed_meanwhile
from scheduler.schedule import Schedule
from swarm.constants import MAX_PROBE_BYTES, PROBE_GOODPUT_BYTES
from swarm.control.gossip import GossipMessage
from swarm.control.membership import token_proof
from swarm.control.messages import (
    Leave,
    publish,
)
from swarm.control.node import Node
from swarm.events import event
from swarm.net.identity import ensure_identity
from swarm.net.link_probe import LinkProber
from swarm.net.message_jitter import MessageJitter
from swarm.net.reachability import NOT_OVER_RELAYS
from swarm.net.transport import Transport
from swarm.peer.activation_watch import ActivationWatch
from swarm.peer.control_router import ControlRouter
from swarm.peer.data_holder import DataHolder
from swarm.peer.departure import Departure
from swarm.peer.faults import tamper
from swarm.peer.hop_intake import HopIntake
from swarm.peer.host_share import ThreadShare
from swarm.peer.inbound_checks import InboundChecks
from swarm.peer.iteration_clock import IterationClock
from swarm.peer.iteration_runner import IterationRunner, commit_timeout
from swarm.peer.join_laps import JoinLaps
from swarm.peer.link_watch import LinkWatch
from swarm.peer.mailbox import Inbox, Outbox
from swarm.peer.members import Members
from swarm.peer.message_chunks import largest_stage_message
from swarm.peer.message_padding import MessagePadding
from swarm.peer.options import PeerOptions, trusted_coordinator
from swarm.peer.pipeline import IterationAborted, IterationTimeout
from swarm.peer.placement_release import PlacementRelease
from swarm.peer.reachability_notice import DialVerdict, announced_addresses, join_reachability
from swarm.peer.reports import Reports
from swarm.peer.run_spec import UnsuitedRun, await_run_spec, keep_members_records
from swarm.peer.schedule_follower import ScheduleFollower
from swarm.peer.stage_keeper import JoinAbandoned, StageKeeper
from swarm.peer.stage_session import restore_source
from swarm.peer.startup_watch import started
from swarm.peer.succession import Succession
from swarm.peer.timeline import Timeline
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord, PeerState

logger = logging.getLogger(__name__)


def warm_up_optimizers() -> None:
    """Build a throwaway optimizer: torch's first one imports torch._dynamo (about 1.5 s of CPU), which would
    otherwise fall between this peer's placement and its first iteration."""
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])


class Peer:
    """One peer process. `run(stop)` blocks until the run ends or `stop` is set.

    It is the lifecycle owner that wires a dozen components (each in a file of its own): what is left here is that
    wiring, the iteration loop and the adoption of schedule epochs, which move the iteration counter and hand epochs
    to the keeper, the data holder, the runner and the inbox together. It runs past ~350 lines because `_join` builds
    those components in the one order their dependencies allow (timed step by step: `JoinLaps`); split, that order
    would be spread over files that each need the others' half-built parts.

    :param scheduler_role: builds the scheduler role this peer takes on should it succeed a dead scheduler, with
      `SchedulerRole`'s keyword arguments (the coordinator package sits above this one, so its caller hands it
      in); None: this peer never takes the role
    """

    def __init__(self, options: PeerOptions, *, scheduler_role: Callable[..., Any] | None = None) -> None:
        self.join_laps: JoinLaps | None = JoinLaps()
        """The steps of its join so far (None once first placed)."""
        self.options = options
        self._make_role = scheduler_role
        self.peer_id = ensure_identity(options.identity_path)
        self.iteration = 0
        self._fresh = False
        """Placed but no iteration committed since (a joiner): an epoch rerunning the iteration before may take it."""
        self.seconds_per_layer, self.loss_seconds = 1.0, 0.0
        self.jitter = MessageJitter()
        """Deviations of the pipeline messages (and probes) it receives from their links' medians."""
        self.timeline = Timeline(options.trace_path, peer=self.peer_id)
        self.node = Node(options.identity_path, options.run_id, host=options.host, port=options.port,
                         on_message=self._on_gossip)
        self.inbox = Inbox()
        self.activations = ActivationWatch(self.inbox.signal, lambda report: self.reports.broken(report))
        self.hops = HopIntake(self.inbox, self.activations, self.jitter)
        self.outbox = Outbox(lambda: self._transport, self.inbox, self.timeline, failed=self._send_failed,
                             tamper=tamper(options.fault) if options.fault else None,
                             sent=lambda *send: self.links.sent(*send) if self.links is not None else None)
        self.clock = IterationClock(options.iteration_deadline)
        self.reports = Reports(self.peer_id, options.run_id, lambda: self.node.gossip,
                               lambda: self.succession.role if self.succession is not None else None)
        self.members: Members | None = None
        self.keeper: StageKeeper | None = None
        self.data: DataHolder | None = None
        self.follower: ScheduleFollower | None = None
        self.succession: Succession | None = None
        self.runner: IterationRunner | None = None
        self.links: LinkWatch | None = None
        self.router: ControlRouter | None = None
        self._transport: Transport | None = None
        self.departure: Departure | None = None
        """Whether it serves on once asked to stop (a graceful leave), from when it has joined."""
        self.release: PlacementRelease | None = None
        """How it gives up a placement it cannot serve (a joiner whose stage's state did not come)."""
        self._halt = threading.Event()
        """Set when it really leaves: ends its background loops (watch, prober, scheduler role)."""
        self.dial_verdict = DialVerdict(self.peer_id)

    @property
    def schedule(self) -> Schedule | None:
        """The schedule epoch in use."""
        return self.follower.schedule if self.follower is not None else None

    @property
    def stage(self) -> int:
        """The stage this peer serves (or announces, before it is placed)."""
        if self.keeper is not None:
            return self.keeper.stage
        return -1 if self.options.stage is None else self.options.stage

    @property
    def state(self) -> PeerState:
        return self.keeper.state if self.keeper is not None else PeerState.JOINING

    @state.setter
    def state(self, state: PeerState) -> None:
        self.keeper.state = state

    # ---- lifecycle --------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> str | None:
        """Join, serve, leave. Returns the reachability its process restarts with ("relayed": the coordinator
        found it cannot be dialled, and the volunteer left that to the peer; `swarm.cli` restarts it), else None."""
        if self.options.reachability == "auto":
            self.dial_verdict.leave_to_relay(stop)
        try:
            if not self._join(stop):
                return self.dial_verdict.restart_as
            while not self.config.iterations or self.iteration < self.config.iterations:
                if stop.is_set() and not self.departure.keep_serving():
                    break
                self._adopt_due_schedule()
                if self.peer_id not in self.schedule.placement:
                    self.keeper.hand_over(self.schedule, self.iteration)  # its stage's last, leaving or benched
                    if self.state == PeerState.DRAINING:
                        self.departure.left(self.iteration)
                        break
                    logger.warning("epoch %d no longer places this peer: asking to be placed", self.schedule.epoch)
                    if not self._rejoin(stop):
                        return
                    continue
                try:
                    self.runner.run(self.keeper.session, self.schedule, self.iteration, self.data)
                    self.iteration += 1
                    self.inbox.iteration = self.iteration
                    self._fresh = False
                except IterationAborted as e:
                    logger.warning("%s", e)
                    self._abandon_iteration()
                except IterationTimeout as e:
                    logger.warning("%s; waiting for the scheduler to replace the schedule", e)
                    self.reports.stuck(self.iteration, self.schedule.epoch)
                    wait = commit_timeout(self.schedule)
                    if not self.follower.wait_for_replacement(self.iteration, self._halt, wait):
                        if self.follower.finished.is_set():  # the run ended meanwhile: nothing to replace
                            break
                        raise
                    self._abandon_iteration()
            why = "run finished" if self.follower.finished.is_set() else "scheduler silent" if stop.is_set() and \
                self.follower.no_scheduler(self.peer_id) else "restarts relayed" if self.dial_verdict.restart_as \
                else "asked to stop" if stop.is_set() else "iterations done"
            logger.info("peer %s stops after iteration %d (%s)", self.peer_id, self.iteration, why,
                        extra=event("stopped", iteration=self.iteration, why=why))
            return self.dial_verdict.restart_as if why == "restarts relayed" else None  # a run that ended: none
        finally:
            self.shutdown()

    def _join(self, stop: threading.Event) -> bool:
        """Join the run and take up the first placement; False if the run ended or this peer was asked to stop
        first (or it left to restart relayed)."""
        o, node, laps = self.options, self.node, self.join_laps or JoinLaps()
        proof = token_proof(o.token, self.peer_id, o.run_id) if o.token else b""
        records = node.start_dht(o.initial_peers, proof=proof, **join_reachability(o))
        started()  # the DHT is up: the start-up watch (`swarm.peer.startup_watch`) has nothing to report
        laps.lap("dht")
        deadline = time.monotonic() + o.join_timeout
        spec = await_run_spec(records, trusted_coordinator(o.initial_peers, o.coordinator), stop, o.join_timeout)
        if spec is None:
            return False
        laps.lap("spec")
        keep_members_records(node, spec, o.token)
        (self.config, self.model_config), self.spec = RunConfig.from_spec(spec), spec
        self.inbox.assembly.max_bytes = largest_stage_message(self.model_config, self.config.stages)
        self.outbox.chunk_bytes = self.config.chunk_bytes
        if node.reachability == "relayed" and self.config.averaging == "hivemind":
            raise UnsuitedRun(f"this peer is relayed and cannot join run {o.run_id}: {NOT_OVER_RELAYS}")
        data = self.config.data
        speed = announced_speed_meanwhile(self.model_config, data.batch_size, data.seq_len, o.device,  # taken below
                                          stages=self.config.stages,
                                          emulate_seconds_per_layer=o.emulate_seconds_per_layer)
        self.members = Members(self.peer_id, o.run_id, o.token, self._issuers)
        if node.reachability == "public":  # it can be dialled: it relays members' streams too, as the coordinator
            node.start_forwarder(self.members.admits)
        wire_shape = self.config.wire_activation_shape(self.model_config.dim)  # padded where emulation says so
        if wire_shape[0] > data.batch_size:
            self.hops.padding = self.outbox.padding = MessagePadding(data.batch_size, wire_shape[0])
        checks = InboundChecks(self.peer_id, o.run_id, wire_shape,
                               lambda: self.follower.known.all if self.follower else ())
        self._transport = Transport(node.dht, {"hop": self.hops, "average": self.inbox.consumer("average"),
                                                "state": self.inbox.consumer("state")}, run_id=o.run_id,
                                    expects=checks.expects, state_gate=checks.state_gate, admitted=self.members.admits,
                                    link_delay=o.link_delay(),
                                    addresses=announced_addresses(lambda: getattr(self.succession, "announced", None),
                                                                  records.fetch_peers))
        node.watch_helpers()  # the transport's p2p client socket: the reaper removes it should this process be killed
        self.outbox.wire_dtype = self.config.wire_dtype
        self.follower = ScheduleFollower(records, spec.coordinator, self.config.heartbeat,
                                         newest_held=lambda: self.inbox.newest_epoch)
        self.router = ControlRouter(self.peer_id, o.run_id, spec.coordinator, follower=self.follower,
                                    members=self.members, dial_verdict=self.dial_verdict, reports=self.reports,
                                    inbox=self.inbox, role=lambda: self.succession.role if self.succession else None)
        self.runner = IterationRunner(self.peer_id, o.run_id, self.config, inbox=self.inbox, outbox=self.outbox,
                                      follower=self.follower, reports=self.reports, clock=self.clock,
                                      timeline=self.timeline, transport=lambda: self._transport,
                                      stopping=lambda: bool(self.departure and self.departure.no_commit_coming()),
                                      averaging_deadline=o.averaging_deadline, checks=checks,
                                      checkpoint_dir=o.checkpoint_dir, log_param_digest=o.log_param_digest,
                                      threads=ThreadShare(o.threads, o.host_registry),
                                      unanswered=lambda p: self.links.suspect(p) if self.links is not None else None)
        laps.lap("transport")
        node.start_gossip(bootstrap=spec.control_addrs, log_path=o.log_gossip)
        laps.lap("gossip")
        self.data = DataHolder.load(self.config.data, self.model_config.vocab_size, self.peer_id,
                                    data_paths=o.data_paths, ledger_path=o.ledger_path)
        laps.lap("data")
        self.seconds_per_layer, self.loss_seconds = speed.result()  # measured meanwhile
        laps.lap("speed")
        self.keeper = StageKeeper(self.peer_id, o, self.config, self.model_config, inbox=self.inbox,
                                  outbox=self.outbox, dht=lambda: node.dht, loss_seconds=self.loss_seconds,
                                  checks=checks, state_timeout=o.state_timeout, gone=lambda: self.follower.gone)
        laps.lap("keeper")
        # its record, with its proof of the join token, brings it its certificate at the scheduler's next read
        node.start_heartbeat(self._record, period=self.config.heartbeat)
        laps.lap("heartbeat")
        self.succession = Succession(self.peer_id, records, node.gossip, self.follower, make_role=self._make_role,
                                     iteration=lambda: self.iteration, on_records=self.members.observe)
        # gossip links to members' sidecars before the admission comes: it must not hang on the one to the
        # coordinator, whose mesh prunes most peers from ~13 on (it then only arrives by lazy gossip)
        self.succession.connect_control_plane(records.fetch_peers())
        laps.lap("links")
        waited = self.members.wait(stop, o.join_timeout, over=self.follower.finished,  # then: links, placement
                                   ask=lambda: publish(node.gossip, o.run_id, self.members.join_message(), wait=False))
        laps.lap("admission")
        read = records.fetch_peers()  # one read (seconds on a loaded DHT), three uses:
        self.members.observe(read)  # the members' certificates, before they probe this joiner
        self.succession.take_records(read)  # whom its first round probes, its gossip links
        self.departure = Departure(self.peer_id, stop, node, self.follower, self.succession, self.keeper)
        self.release = PlacementRelease(self.peer_id, self.follower, set_state=lambda s: setattr(self, "state", s),
                                        beat_now=node.heartbeat.beat_now, timeout=o.join_timeout)
        # the goodput probe carries a pipeline message's bytes where they are more than its usual size
        probe_bytes = min(max(PROBE_GOODPUT_BYTES, self.config.message_size(self.model_config.dim)), MAX_PROBE_BYTES)
        self.links = LinkWatch(LinkProber(self._transport, sample_size=o.probe_sample, jitter=self.jitter,
                                          goodput_bytes=probe_bytes),
                               self.peer_id, self.succession.live, skip=frozenset({spec.coordinator}),
                               measured=node.heartbeat.beat_now, gone=lambda: self.follower.gone)
        laps.lap("records")
        took = self.links.start(self._halt, self.follower.finished)
        laps.lap("probes")
        self.succession.connect_control_plane(self.succession.live())
        laps.lap("links")
        self.succession.start(self._halt, dict(config=self.config, spec=spec, peer_id=self.peer_id, records=records,
                                               gossip=node.gossip, metrics_path=o.metrics_path,
                                               local=self._on_gossip, token=o.token))
        joined = laps.finish("succession")
        logger.info("peer %s joined run %s (%.4f s/layer, admitted in %.1f s, %d links in %.1f s) %.1f s after its "
                    "start (%s): to be placed", self.peer_id, o.run_id, self.seconds_per_layer, waited,
                    len(self.links.links), took, laps.total, laps.longest(), extra=event("joined", **joined))
        warm_up_optimizers()  # while the scheduler plans, not once placed, when the whole stage group waits
        schedule = self.follower.wait_for_placement(self.peer_id, stop, deadline - time.monotonic())
        laps.lap("placement")
        if schedule is not None:
            return self._start_on(schedule, stop)
        if not stop.is_set() and not self.follower.finished.is_set():
            raise TimeoutError("no schedule placed this peer in time")
        return False

    def _rejoin(self, stop: threading.Event) -> bool:
        """Dropped (taken for dead, or benched): announce again, wait to be placed, load the stage; False: run over."""
        self.state = PeerState.JOINING
        self.inbox.online = False
        schedule = self.follower.wait_for_placement(self.peer_id, stop, self.options.join_timeout,
                                                    newer_than=self.schedule.epoch)
        if schedule is None:
            return False
        return self._start_on(schedule, stop)

    def shutdown(self) -> None:
        """Announce leaving, then stop heartbeat, gossip, transport and DHT (each only if it was started)."""
        self._halt.set()
        self.inbox.close()  # a transport consumer waiting on a full inbox lets go
        if self.node.heartbeat is not None:
            self.state = PeerState.LEAVING  # what its last record says
        self.node.leave(Leave(peer=self.peer_id))
        self.outbox.shutdown()
        if self.keeper is not None:
            self.keeper.close()
        if self._transport is not None:
            self._transport.shutdown()
            self._transport = None
        self.node.stop()

    def _record(self) -> PeerRecord:
        return PeerRecord(peer_id=self.peer_id, stage=self.stage, seconds_per_layer=self.seconds_per_layer,
                          memory_slots=self.config.memory, links=dict(self.links.links if self.links else {}),
                          loss_seconds=self.loss_seconds, addresses=tuple(self.node.visible_maddrs()),
                          state=self.state, data_holder=bool(self.options.data_paths),
                          control_addrs=self.node.control_addrs(), jitter=self.jitter.quantiles(),
                          admission=self.members.proof, cert=self.members.cert,
                          reachability=self.node.reachability or self.dial_verdict.reachability,
                          unreachable=self.links.unreachable if self.links else ())

    def _issuers(self) -> set[str]:
        """Whose membership certificates this peer takes: the coordinator's, its scheduler's, named successors'."""
        f = self.follower
        named = f.schedule.meta.get("successors", []) if f is not None and f.schedule is not None else []
        return {self.spec.coordinator, *(() if f is None else (f.scheduler,)), *named}

    # ---- schedules ----------------------------------------------------------------------------------
    def _use(self, schedule: Schedule) -> None:
        """`schedule` is the epoch in use from now on (it and the epochs before it are pending no more); the peers it
        places that were declared gone under an older epoch (this one too, placed again after it) are back."""
        self.follower.placed_anew(schedule)
        self.follower.schedule = schedule
        self.members.follow(schedule.placement)
        self.inbox.adopt(schedule.epoch)

    def _start_on(self, schedule: Schedule, stop: threading.Event) -> bool:
        """First placement (or a placement after being dropped): the keeper equips this peer's stage. A joiner that
        a newer epoch places otherwise starts on that one; one whose stage's state does not come gives the
        placement up (`PlacementRelease`) and is left unplaced, to ask again. False if the run ended or this peer
        was asked to stop meanwhile (it holds no stage to serve)."""
        while True:
            self.iteration = self.inbox.iteration = int(schedule.meta.get("start_iteration", 0))
            self._use(schedule)  # after the iteration is set: what its senders sent before this peer heard is filed
            self._fresh = True  # until its first iteration commits
            try:
                self.keeper.start(schedule, self.iteration, revised=self.follower.poll_newer)
                break
            except JoinAbandoned as e:
                logger.warning("%s: %s", "placed otherwise" if e.revised else "giving this placement up", e,
                               extra=event("join_abandoned", stage=self.stage, epoch=schedule.epoch, why=str(e),
                                           revised=e.revised))
                later = self.follower.due(self.iteration) if e.revised else None
                if later is None:  # (or a still newer epoch took the place of the one that placed it otherwise)
                    later = self.release.release(schedule, stop, self._halt)
                    if later is None:
                        return False
            if self.peer_id not in later.placement:
                self._use(later)  # the loop asks to be placed again
                return True
            schedule = later
        if self.stage == 0:
            self.data.follow(schedule, self.iteration, self.follower.positions_for(schedule, self.iteration, stop),
                             placed_again=True)
        first, self.join_laps = self.join_laps, None  # the steps of its join, up to its first placement
        took = first.finish("stage") if first is not None else {}
        logger.info("peer %s runs schedule epoch %d on stage %d from iteration %d%s", self.peer_id, schedule.epoch,
                    self.stage, self.iteration, f" {took['seconds']:.1f} s after its start" if took else "",
                    extra=event("placed", stage=self.stage, epoch=schedule.epoch, iteration=self.iteration, **took))
        return True

    def _adopt_due_schedule(self) -> None:
        if (due := self.follower.due(self.iteration)) is not None:
            self._adopt(due)

    def _abandon_iteration(self) -> None:
        """Drop the iteration's gradients and stashes; a holder's draws go back (`DataHolder.abandon`)."""
        self.keeper.worker.reset()
        if self.data is not None:
            self.data.abandon(self.iteration, self.follower.finished_after, self.follower.left_out(self.iteration))
        self._adopt_due_schedule()

    def _adopt(self, schedule: Schedule) -> None:
        old = self.schedule
        moved = self.peer_id in schedule.placement and schedule.placement[self.peer_id] != self.stage
        handover = schedule.meta.get("handover")
        source = handover.get(self.peer_id) if isinstance(handover, dict) else None
        restart = restore_source(schedule, self.peer_id) if moved and not isinstance(source, str) else None
        if moved and not isinstance(source, str) and restart is None:
            logger.error("schedule epoch %d moves this peer to stage %d without a peer to take it over from: refused",
                         schedule.epoch, schedule.placement[self.peer_id])
            self.follower.drop_pending(through=schedule.epoch)
            return
        start = int(schedule.meta.get("start_iteration", 0))
        if self._fresh and start < self.iteration:
            # placed from the next iteration, this joiner is in the epoch that reruns the one in progress: it runs
            # that one too (its state is the last commit's, as the rerun's is)
            logger.info("epoch %d reruns iteration %d with this peer: it starts there, not at %d", schedule.epoch,
                        start, self.iteration)
            self.iteration = self.inbox.iteration = start
        self.runner.new_epoch()
        self._use(schedule)
        if self.peer_id not in schedule.placement:
            return
        if moved:
            self.keeper.move(schedule, source if restart is None else restart, restart=restart is not None)
        else:
            self.keeper.equip(schedule, old, self.iteration)
        if self.stage == 0:
            self.data.follow(schedule, self.iteration, self.follower.committed_positions)
        logger.info("adopted schedule epoch %d at iteration %d (%d peers)", schedule.epoch, self.iteration,
                    len(schedule.placement))

    # ---- messages ---------------------------------------------------------------------------------
    def _send_failed(self, peer: str, unreachable: bool) -> None:
        if self.runner is not None:
            self.runner.note_unreachable(peer, certain=unreachable)

    def _on_gossip(self, msg: GossipMessage) -> None:
        """Gossip thread: routed once the peer knows its run (`ControlRouter`); nothing it could act on before."""
        if self.router is not None:
            self.router.route(msg)
