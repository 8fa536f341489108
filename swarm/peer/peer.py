"""`Peer`: a volunteer's process in a run, from joining to leaving.

Joins the DHT through any known peer, reads the signed run spec, measures its own compute speed and its
links to a sample of peers, and announces itself (a signed record refreshed by heartbeat). Once the
coordinator's schedule places it, it builds its stage's worker: from the run's seed at the start, or from a
same-stage peer's weights and optimizer state when it joins mid-run. Then it iterates:

1. its part of the pipeline (`PipelineExecutor`); a data holder draws its microbatches from the shards the
   schedule gives it and records each draw in its `DataLedger`;
2. data holders report `done`; every peer waits for the scheduler's `commit` of the iteration (the point
   after which its samples count as processed);
3. the stage group's averaging and one optimizer step.

Iterations are atomic: a microbatch that lost a peer on its path is re-queued by its holder within the
iteration (`PipelineExecutor.requeue`); when that cannot work (a data holder died, no detour, a joiner takes a
shard over), the scheduler publishes a new schedule epoch that starts at the uncommitted iteration; every peer
abandons it (gradients dropped, data holders requeue their draws and rewind), adopts the new epoch and runs the
iteration again, so no sample is lost or trained twice. On stop (Ctrl+C, SIGTERM or the run's last iteration) it
announces that it leaves and shuts down.
"""

from __future__ import annotations

import logging
import queue
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import torch

from peers.checkpoint import (
    CheckpointError,
    load_stage_checkpoint,
    load_stage_tensors,
    param_digest,
    save_stage_checkpoint,
)
from peers.data import Corpus
from peers.data_ledger import DataLedger
from peers.device_speed import measure_loss_seconds, measure_seconds_per_layer
from peers.holder_shards import HolderShards
from peers.paced_worker import PacedWorker
from peers.stage import balanced_split, neighbour_blocks, stage_template
from peers.worker import StageWorker, WorkerError
from scheduler.constants import LOSS_FACTOR
from scheduler.round_trips import round_trips
from scheduler.schedule import Schedule
from swarm.constants import DHT_TIMEOUT, LOOPBACK_HOST, PROBE_SAMPLE_SIZE, SEND_CONCURRENCY
from swarm.control.gossip import GossipMessage
from swarm.control.messages import (
    Broken,
    Commit,
    ControlMessage,
    Done,
    Finished,
    Gone,
    Join,
    Leave,
    ScheduleNotice,
    Stuck,
    Unreachable,
    Unrecoverable,
    as_gossip,
    publish,
    received,
)
from swarm.control.node import Node
from swarm.control.records import SwarmRecords
from swarm.net.delivery import Inbound, Undelivered
from swarm.net.identity import ensure_identity
from swarm.net.link_probe import LinkProber
from swarm.net.message_jitter import MessageJitter
from swarm.net.transport import PeerUnreachable, Transport, TransportError
from swarm.peer.pipeline import IterationAborted, IterationTimeout, PipelineExecutor, Requeue
from swarm.peer.timeline import Timeline
from swarm.run_config import RunConfig
from swarm.stage_group.allgather import average_stage_group, flatten, unflatten
from swarm.stage_group.state_transfer import load_state, send_state, unflatten_weights
from swarm.wire import Direction, HopHeader, PeerRecord, PeerState, WireError

logger = logging.getLogger(__name__)

MAX_ITERATIONS_AHEAD = 2
"""Messages for iterations further ahead than this are refused, so a flood cannot fill memory."""
LINK_PROBE_PERIOD = 5.0
"""Seconds between two looks for peers whose links this peer has not measured yet (joiners)."""
LINK_REFRESH_PERIOD = 300.0
"""Seconds between two re-measurements of the stalest links."""
SCHEDULE_POLL_PERIOD = 5.0
"""Seconds between two reads of the newest schedule from the DHT when no notice came."""
DEADLINE_FACTOR = 5.0
MIN_ITERATION_DEADLINE = 60.0
RECENT_ITERATIONS = 5
EMULATION_MARGIN = 2.0
"""Compute emulation pads the loss step to at least this multiple of its measured time (load varies)."""
COMMIT_TIMEOUT = 120.0
"""Seconds to wait for the scheduler's commit (or a replacing epoch) before giving up on the run."""
HOP_DEADLINE_FACTOR = 3.0
HOP_DEADLINE_SLACK = 2.0
"""A microbatch's backward is overdue HOP_DEADLINE_FACTOR times its planned round trip (scaled to how much longer
than predicted iterations take) plus HOP_DEADLINE_SLACK seconds after its forward left this peer."""
DRAIN_TIMEOUT = 120.0
"""Most seconds a peer asked to stop keeps serving while it waits for a schedule without it (a graceful leave)."""
HANDOVER_TIMEOUT = 60.0
"""Seconds a peer moved to another stage waits for the state of the peer it replaces."""
HOP_CHECK_TIMEOUT = 5.0
"""Seconds the next hop of an overdue microbatch has to acknowledge a one-byte probe before it is taken for gone."""


@dataclass(frozen=True)
class PeerOptions:
    """How this peer joins (the run itself is described by the coordinator's run spec)."""

    initial_peers: tuple[str, ...]
    """Multiaddrs of any peers (or the coordinator) already in the run."""
    identity_path: str
    """Key file; created on first run. One key, one peer id, in the DHT, the transport and gossip."""
    run_id: str = "skippipe"
    host: str = LOOPBACK_HOST
    port: int = 0
    stage: int | None = None
    """Serve this stage (None: the planner decides)."""
    data_paths: tuple[str, ...] = ()
    """Local training files: this peer becomes a data holder with its own data."""
    device: str = "cpu"
    precision: str = "auto"
    """Autocast of the compute: fp32, bf16, fp16, or auto (bf16 on CUDA, fp32 on CPU)."""
    iteration_deadline: float = 300.0
    """Most seconds this peer waits for its part of one iteration; the deadline it uses is a multiple of how
    long iterations take (see `Peer.iteration_deadline`), capped by this."""
    averaging_deadline: float = 60.0
    join_timeout: float = 120.0
    """Seconds to wait for the run spec and for a schedule that places this peer."""
    log_gossip: str | None = None
    ledger_path: str | None = None
    """Where a data holder appends its data ledger (JSON lines)."""
    checkpoint_dir: str | None = None
    """Where this peer writes its own checkpoint every `checkpoint_every` iterations of the run."""
    metrics_path: str | None = None
    """Where this peer writes the run's metrics if it becomes the scheduler (the coordinator died)."""
    probe_sample: int = PROBE_SAMPLE_SIZE
    """Peers whose links one probing round measures (unmeasured ones first, then the stalest)."""
    log_param_digest: bool = False
    """Log a digest of the stage's parameters after every step (to check that a stage group agrees)."""
    trace_path: str | None = None
    """Where this peer appends its timeline (compute and send spans, JSON lines) for a Chrome trace."""
    emulate_seconds_per_layer: float | None = None
    """Compute emulation: announce this speed instead of the measured one and pad every operation to it."""
    link_latency: Mapping[str, float] | None = None
    """Link emulation: one-way seconds the transport waits before each message to that peer."""


class Peer:
    """One peer process. `run(stop)` blocks until the run ends or `stop` is set.

    :param scheduler_role: builds the scheduler role this peer takes on should it succeed a dead scheduler, with
      `SchedulerRole`'s signature (the coordinator package sits above this one, so its caller hands it in); None:
      this peer never takes the role
    """

    def __init__(self, options: PeerOptions, *, scheduler_role: Callable[..., Any] | None = None) -> None:
        self.options = options
        self._make_role = scheduler_role
        self.peer_id = ensure_identity(options.identity_path)
        self.iteration = 0
        self._fresh = False
        """Placed but no iteration committed since (a joiner): an epoch rerunning the iteration before may take it."""
        self.stage = -1 if options.stage is None else options.stage  # announced: the planner pins it there
        self.state = PeerState.JOINING
        self.schedule: Schedule | None = None
        self.worker: StageWorker | None = None
        self.links: dict[str, tuple[float, float]] = {}
        self.seconds_per_layer = 1.0
        self.loss_seconds = 0.0
        self.jitter = MessageJitter()
        """Deviations of the pipeline messages (and probes) it receives from their links' medians."""
        self._commit_periods: list[float] = []
        """Seconds between the scheduler's consecutive commits as this peer saw them: the swarm's iteration period,
        slowest peer and averaging included (for this peer's deadlines)."""
        self._last_commit: float | None = None
        self.ledger = DataLedger(options.ledger_path, holder=self.peer_id)
        self.data: HolderShards | None = None
        """The shards it draws from while it holds data (stage 0); set up once the corpus is built."""
        self._raw: queue.Queue[Inbound | Undelivered | None] = queue.Queue()
        """Messages for the main loop (None only wakes it up)."""
        self._gone: frozenset[str] = frozenset()
        """Peers the scheduler declared gone: forwards are detoured around them (replaced, never mutated)."""
        self._unreachable: frozenset[str] = frozenset()
        """Peers no stream could be opened to since this peer adopted its schedule: detoured around like gone ones,
        and not waited for by the stage averaging (replaced, never mutated)."""
        self._buckets: dict[tuple[int, str], list[Inbound]] = defaultdict(list)
        self._held: list[Inbound] = []
        """Messages of a newer epoch than the one in use, kept until this peer adopts it."""
        self._sender = ThreadPoolExecutor(SEND_CONCURRENCY, thread_name_prefix="skippipe-send")
        self._schedule_notice = threading.Event()
        self._announced_epoch = 0
        """The newest epoch this peer has heard of (a scheduler's notice, or a message a peer sent under it)."""
        self._last_schedule_poll = 0.0
        self._finished = threading.Event()
        self._scheduler_seen = time.monotonic()
        self._role = None
        self._role_thread: threading.Thread | None = None
        self._stop: threading.Event | None = None
        """Set when this peer is asked to stop (it may drain first, see `_drain`)."""
        self._halt = threading.Event()
        """Set when it really leaves: ends its background loops (watchdog, prober, scheduler role)."""
        self._drain_end = 0.0
        self._newer: Schedule | None = None
        self._commits: set[tuple[int, int]] = set()
        self._committed_positions: tuple[int, dict[str, Any]] = (-1, {})
        """(iteration, shard index as a string -> position) from the scheduler's newest commit: where a shard taken
        over at the next iteration starts (newer than the positions its schedule was planned with)."""
        self._unreachable_reported: set[str] = set()
        self._round_trips: tuple[int, dict[int, float]] = (-1, {})
        """(epoch, microbatch -> this peer's planned round trip in it), see `_hop_deadlines`."""
        self._transport = self._averager = None
        self.node = Node(options.identity_path, options.run_id, host=options.host, port=options.port,
                         on_message=self._on_gossip)
        self._announced: dict[str, PeerRecord] | None = None
        """The live peers' records as the watchdog last read them from the DHT."""
        self.timeline = Timeline(options.trace_path, peer=self.peer_id)
        self.records: SwarmRecords | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        try:
            self._join(stop)
            if self.schedule is None:
                return
            while not self.config.iterations or self.iteration < self.config.iterations:
                if stop.is_set() and not self._drain():
                    break
                self._adopt_due_schedule()
                if self.peer_id not in self.schedule.placement and self.state == PeerState.DRAINING:
                    self._hand_over()
                    break
                if self.peer_id not in self.schedule.placement:
                    logger.warning("the schedule of epoch %d no longer includes this peer; asking to be placed again",
                                   self.schedule.epoch)
                    if not self._rejoin(stop):
                        return
                    continue
                try:
                    self._run_iteration()
                    self.iteration += 1
                    self._fresh = False
                except IterationAborted as e:
                    logger.warning("%s", e)
                    self._abandon_iteration()
                except IterationTimeout as e:
                    logger.warning("%s; waiting for the scheduler to replace the schedule", e)
                    self._report_stuck()
                    if not self._wait_for_replacement(self._halt):
                        raise
                    self._abandon_iteration()
            logger.info("peer %s stops after iteration %d", self.peer_id, self.iteration)
        finally:
            self.shutdown()

    def _join(self, stop: threading.Event) -> None:
        o = self.options
        self.records = self.node.start_dht(o.initial_peers)
        spec = None
        deadline = time.monotonic() + o.join_timeout
        while spec is None and not stop.is_set() and time.monotonic() < deadline:
            spec = self.records.fetch_run_spec(timeout=DHT_TIMEOUT)
            if spec is None:
                time.sleep(0.5)
        if spec is None:
            if not stop.is_set():
                raise TimeoutError(f"no run spec for run {o.run_id!r} found through {list(o.initial_peers)}")
            return
        self.config, self.model_config = RunConfig.from_spec(spec)
        self.spec = spec
        self.coordinator = self.scheduler = spec.coordinator
        latency = dict(o.link_latency or {})
        self._transport = Transport(self.node.dht, self._on_receive, run_id=o.run_id,
                                    link_delay=(lambda p: latency.get(p, 0.0)) if latency else None)
        self.node.start_gossip(bootstrap=spec.control_addrs, log_path=o.log_gossip)
        self.corpus = Corpus.build(self.config.data)
        if self.corpus.vocab_size != self.model_config.vocab_size:
            raise ValueError(f"tokenizer has {self.corpus.vocab_size} tokens, the run spec says "
                             f"{self.model_config.vocab_size}")
        if o.data_paths:
            self.corpus = self.corpus.with_documents(o.data_paths)
        self.data = HolderShards(self.corpus, self.ledger)
        shape = (self.model_config, self.config.data.batch_size, self.config.data.seq_len, o.device)
        self.loss_seconds = measure_loss_seconds(*shape)
        if o.emulate_seconds_per_layer:
            # the emulated device does what the model says, but never less than this machine can
            self.seconds_per_layer = o.emulate_seconds_per_layer
            first = balanced_split(self.model_config.n_layers, self.config.stages)[0]
            self.loss_seconds = max(LOSS_FACTOR * self.seconds_per_layer * first,
                                    EMULATION_MARGIN * self.loss_seconds)
        else:
            self.seconds_per_layer = measure_seconds_per_layer(*shape)
        self.node.start_heartbeat(self._record, period=self.config.heartbeat)
        self._prober = LinkProber(self._transport, sample_size=o.probe_sample, jitter=self.jitter)
        self._probe_links()
        try:
            self.node.heartbeat.beat_now()  # the scheduler places a joiner once its record shows its links
        except Exception as e:  # the next heartbeat carries them anyway
            logger.warning("could not publish the measured links at once: %s", e)
        threading.Thread(target=self._keep_probing, args=(self._halt,), name="skippipe-prober", daemon=True).start()
        self._connected: set[str] = set()
        self._connect_control_plane(self.records.fetch_peers())
        threading.Thread(target=self._watch_scheduler, args=(self._halt,), name="skippipe-watchdog",
                         daemon=True).start()
        publish(self.node.gossip, o.run_id, Join(peer=self.peer_id), wait=False)
        logger.info("peer %s joined run %s (%.4f s/layer); waiting to be placed", self.peer_id, o.run_id,
                    self.seconds_per_layer)
        while not stop.is_set() and not self._finished.is_set() and time.monotonic() < deadline:
            schedule = self._fetch_schedule()
            if schedule is not None and self.peer_id in schedule.placement:
                self._start_on(schedule)
                return
            self._schedule_notice.wait(0.5)
            self._schedule_notice.clear()
        if not stop.is_set() and not self._finished.is_set():
            raise TimeoutError("no schedule placed this peer in time")

    def _rejoin(self, stop: threading.Event) -> bool:
        """Dropped by the scheduler (taken for dead): announce again and wait to be placed, then load the stage's
        current state from a same-stage peer. False if the run ended first."""
        self.state = PeerState.JOINING
        end = time.monotonic() + self.options.join_timeout
        while not stop.is_set() and not self._finished.is_set() and time.monotonic() < end:
            schedule = self._fetch_schedule()
            if schedule is not None and self.peer_id in schedule.placement and \
                    schedule.epoch > self.schedule.epoch:
                self._start_on(schedule)
                return True
            self._schedule_notice.wait(0.5)
            self._schedule_notice.clear()
        return False

    # ---- graceful leave ---------------------------------------------------------------------------
    def _drain(self) -> bool:
        """Asked to stop: whether to keep serving. A placed peer of a running swarm announces DRAINING and serves on
        until the scheduler plans without it (the iteration in progress finishes, nothing in flight is lost), for at
        most DRAIN_TIMEOUT; it leaves at once if the run has finished or it holds the scheduler role."""
        if self._finished.is_set() or self.schedule is None or self.peer_id not in self.schedule.placement or \
                self.node.heartbeat is None or self._role is not None or self._scheduler_silent():
            return False
        if self.state != PeerState.DRAINING:
            self.state = PeerState.DRAINING
            self._drain_end = time.monotonic() + DRAIN_TIMEOUT
            try:
                self.node.heartbeat.beat_now()
            except Exception as e:  # the next heartbeat carries the state anyway
                logger.warning("could not announce draining at once: %s", e)
            logger.info("asked to stop: serving until the scheduler plans without this peer (at most %.0f s)",
                        DRAIN_TIMEOUT)
        elif time.monotonic() > self._drain_end:
            logger.warning("the scheduler did not plan without this peer within %.0f s: leaving now", DRAIN_TIMEOUT)
            return False
        return True

    def _stopping_run(self) -> bool:
        """Asked to stop while the run itself finishes (its scheduler said so): no commit will come."""
        return self._stop is not None and self._stop.is_set() and self._finished.is_set()

    def _hand_over(self) -> None:
        """The scheduler plans without this draining peer: if it was its stage's last, send the stage's state to
        the peer moved there to take over (the schedule names it), then leave."""
        handover = self.schedule.meta.get("handover")
        takers = [p for p, source in handover.items() if source == self.peer_id and p in self.schedule.placement] \
            if isinstance(handover, dict) else []
        sent: list[Future[bool]] = []
        for peer in takers:
            send_state(me=self.peer_id, worker=self.worker, to=peer, run_id=self.options.run_id,
                       iteration=self.iteration, epoch=self.schedule.epoch,
                       send=lambda *a: sent.append(self._send(*a)))
        try:
            delivered = all(f.result(timeout=HANDOVER_TIMEOUT) for f in sent)
        except TimeoutError:
            delivered = False
        if takers:
            logger.info("handed stage %d's state (step %d) over to %s%s", self.stage, self.worker.steps,
                        ", ".join(takers), "" if delivered else " (not delivered: it restarts from its own blocks)")
        logger.info("left gracefully: schedule epoch %d runs without this peer from iteration %d",
                    self.schedule.epoch, self.iteration)

    def _move(self, schedule: Schedule, source: str, *, restart: bool = False) -> None:
        """The scheduler moved this peer to another stage, to take its state over from `source`: that stage's last
        peer leaving gracefully, or a peer staying on it (the move refills a group a departure shrank). With
        `restart`, nobody has the stage any more and `source` is a peer of a neighbouring stage (a full pipeline
        cannot skip the stage): it restarts as a joiner of an emptied stage does. Should the state not come, the
        stage restarts from this peer's own blocks (as a stage that lost every peer restarts from a neighbour's)."""
        old, old_stage = self.worker, self.stage
        self.stage, self.state = schedule.placement[self.peer_id], PeerState.JOINING
        self.worker = self._new_worker(schedule)
        if self._averager is not None:  # its averaging group was the old stage's
            self._averager.shutdown()
            self._averager = None
        try:
            if restart:
                self._restore_stage(source, schedule.placement[source])
                logger.warning("moved from stage %d to stage %d, which had no peer left", old_stage, self.stage)
            else:
                steps = load_state(self.worker, self._receive_state(source, timeout=HANDOVER_TIMEOUT))
                logger.warning("moved from stage %d to stage %d: took over its state (step %d) from %s", old_stage,
                               self.stage, steps, source)
        except (TimeoutError, WorkerError) as e:
            load_stage_tensors(self.worker, neighbour_blocks(self.worker.module, old.module.state_dict()), {},
                               steps=old.steps)
            logger.warning("moved from stage %d to stage %d, but %s's state did not come (%s): initialised it from "
                           "this peer's stage %d blocks", old_stage, self.stage, source, e, old_stage)
        self.state = PeerState.ONLINE
        for k in [k for k in self._buckets if k[1] == "state"]:
            del self._buckets[k]

    def shutdown(self) -> None:
        """Announce leaving, then stop heartbeat, gossip, transport and DHT (each only if it was started)."""
        self._halt.set()
        if self.node.heartbeat is not None:
            self.state = PeerState.LEAVING
            self.node.stop_heartbeat()
        if self.node.gossip is not None:
            try:
                publish(self.node.gossip, self.options.run_id, Leave(peer=self.peer_id), timeout=2)
            except Exception as e:
                logger.debug("leave notice not sent: %s", e)
            self.node.stop_gossip()
        self._sender.shutdown(wait=True, cancel_futures=True)
        if self._averager is not None:
            self._averager.shutdown()
            self._averager = None
        if self._transport is not None:
            self._transport.shutdown()
            self._transport = None
        self.node.stop()

    # ---- announcements ----------------------------------------------------------------------------
    def _record(self) -> PeerRecord:
        return PeerRecord(peer_id=self.peer_id, stage=self.stage, seconds_per_layer=self.seconds_per_layer,
                          memory_slots=self.config.memory, links=dict(self.links), loss_seconds=self.loss_seconds,
                          addresses=tuple(str(a) for a in self.node.dht.get_visible_maddrs()), state=self.state,
                          data_holder=bool(self.options.data_paths), control_addrs=tuple(self.node.gossip_info.maddrs),
                          jitter=self.jitter.quantiles())

    # ---- the scheduler and its successor ------------------------------------------------------------
    def _connect_control_plane(self, records: dict[str, PeerRecord], limit: int = 8) -> None:
        """Gossip links to other peers' sidecars, so the control plane survives the coordinator."""
        for p, r in sorted(records.items()):
            if len(self._connected) >= limit:
                return
            if p == self.peer_id or p in self._connected or not r.control_addrs:
                continue
            try:
                self.node.gossip.connect(r.control_addrs[0], timeout=5)
                self._connected.add(p)
            except Exception as e:  # an unreachable sidecar is skipped; others will do
                logger.debug("gossip link to %s failed: %s", p, e)

    def _successor(self, records: dict[str, PeerRecord]) -> str | None:
        """The deterministic successor of a dead scheduler: the smallest live peer id of the schedule."""
        schedule = self._newer or self.schedule
        live = [p for p in (schedule.placement if schedule else ()) if p in records]
        return min(live) if live else None

    def _trusted(self, sender: str) -> bool:
        """The scheduler, or (once the scheduler has missed a heartbeat) its would-be successor."""
        if sender == self.scheduler:
            return True
        stale = time.monotonic() - self._scheduler_seen > self.config.heartbeat * 1.5
        return stale and sender == getattr(self, "_candidate", None)

    def _scheduler_silent(self) -> bool:
        """The scheduler's record has not been seen for longer than a record lives (three heartbeats and a grace)."""
        return time.monotonic() - self._scheduler_seen > 3 * self.config.heartbeat + 2.0

    def _watch_scheduler(self, stop: threading.Event) -> None:
        """Background: follow the scheduler's heartbeat; when it is gone, the successor takes over planning."""
        while not stop.is_set() and not self._finished.is_set():
            time.sleep(self.config.heartbeat)
            try:
                records = self.records.fetch_peers()
            except Exception as e:
                logger.debug("watchdog could not read the DHT: %s", e)
                continue
            live = {p: r for p, r in records.items() if r.state not in (PeerState.LEAVING, PeerState.DRAINING)}
            self._announced = live
            self._connect_control_plane(live)
            if self.scheduler in live:
                self._scheduler_seen = time.monotonic()
                continue
            self._candidate = self._successor(live)
            if not self._scheduler_silent() or self._candidate is None:
                continue
            logger.warning("scheduler %s is gone; %s takes over", self.scheduler, self._candidate)
            self.scheduler, self._scheduler_seen = self._candidate, time.monotonic()
            self._schedule_notice.set()
            if self._candidate == self.peer_id and self._role is None:
                self._role_thread = threading.Thread(target=self._run_scheduler, args=(stop,), daemon=True,
                                                     name="skippipe-scheduler")
                self._role_thread.start()

    def _run_scheduler(self, stop: threading.Event) -> None:
        if self._make_role is None:
            logger.error("this peer succeeds the scheduler but was started without a scheduler role to take")
            return
        try:
            schedules = [s for s in (self.schedule, self._newer) if s is not None]
            self._role = self._make_role(self.config, self.spec, self.peer_id, self.records, self.node.gossip,
                                         metrics_path=self.options.metrics_path, local=self._on_gossip,
                                         ends_run_on_stop=False)
            self._role.resume(schedules, self.iteration)
            while not stop.is_set() and not self._role.done:
                self._role.tick()
            self._role.finish(stop)
        except Exception:
            logger.exception("the scheduler role failed")

    def _probe_links(self, *, only_unmeasured: bool = False) -> None:
        """Measure latency and goodput to a sample of the announced peers (the planner's cost matrix); the
        heartbeat publishes them with this peer's record. Later rounds use the peers the watchdog last read."""
        try:
            announced = self._announced if self._announced is not None else self.records.fetch_peers()
            others = [p for p in announced if p not in (self.peer_id, self.coordinator)]
            if only_unmeasured:
                others = [p for p in others if p not in self._prober.probed()]
            if others:
                self.links = self._prober.probe_round(others)
        except (TransportError, WireError, TimeoutError) as e:
            logger.warning("link probing failed: %s", e)

    def _keep_probing(self, stop: threading.Event) -> None:
        """Background: measure links to peers that announced themselves after this one, and now and then
        re-measure the stalest links."""
        refreshed = time.monotonic()
        while not stop.wait(LINK_PROBE_PERIOD) and not self._finished.is_set():
            refresh = time.monotonic() - refreshed > LINK_REFRESH_PERIOD
            if refresh:
                refreshed = time.monotonic()
            self._probe_links(only_unmeasured=not refresh)

    def _tell_scheduler(self, message: ControlMessage) -> None:
        """Gossip a report the scheduler acts on; a peer holding the scheduler role also hands it to its own
        (gossip does not deliver a peer's own messages back to it)."""
        if self.node.gossip is None:
            return
        publish(self.node.gossip, self.options.run_id, message, wait=False)
        if self._role is not None:
            self._role.deliver(as_gossip(message, self.options.run_id, self.peer_id))

    def _report_stuck(self) -> None:
        """Tell the scheduler that this iteration is stuck here (it restarts it under a new epoch if nobody died)."""
        self._tell_scheduler(Stuck(peer=self.peer_id, iteration=self.iteration, epoch=self.schedule.epoch))

    def _note_broken(self, sender: str, report: Broken) -> None:
        """Gossip thread: a peer reports a microbatch attempt broken; the main loop's executor re-queues it if it is
        this holder's (it checks the iteration, epoch and attempt)."""
        if self.schedule is None or sender not in self.schedule.placement:
            return
        self._raw.put(Requeue(iteration=report.iteration, epoch=report.epoch, microbatch=report.microbatch,
                              attempt=report.attempt, gone=report.gone, why=report.why, maybe_ran=report.maybe_ran))

    # ---- schedules --------------------------------------------------------------------------------
    def _on_gossip(self, msg: GossipMessage) -> None:
        if self._role is not None:
            self._role.deliver(msg)
        try:
            message = received(msg, self.options.run_id)
        except WireError as e:
            logger.warning("ignored a control message from %s: %s", msg.sender, e)
            return
        scheduler_only = (ScheduleNotice, Gone, Finished, Commit)
        if isinstance(message, scheduler_only) and not self._trusted(msg.sender):
            logger.warning("ignored a %s from %s: not the run's scheduler", type(message).__name__, msg.sender)
            return
        if isinstance(message, ScheduleNotice):
            self._announced_epoch = max(self._announced_epoch, message.epoch)
            self._schedule_notice.set()
        elif isinstance(message, Gone):
            self._gone = self._gone | frozenset(message.peers)
            self._raw.put(None)
        elif isinstance(message, Broken) and self.stage == 0:
            self._note_broken(msg.sender, message)
        elif isinstance(message, Finished):
            logger.info("the run has finished")
            self._finished.set()
            self._schedule_notice.set()
        elif isinstance(message, Commit):
            if message.iteration > self._committed_positions[0]:
                self._committed_positions = (message.iteration, message.shards)
            self._commits.add((message.iteration, message.epoch))
            self._raw.put(None)

    def _fetch_schedule(self) -> Schedule | None:
        msg = self.records.fetch_schedule(signers={self.coordinator, self.scheduler})
        return msg.to_schedule() if msg is not None else None

    def _hold(self, m: Inbound) -> None:
        """Keep a message of a newer epoch than the one in use (its sender switched first) until this peer does."""
        self._held.append(m)
        self._announced_epoch = max(self._announced_epoch, m.header.epoch)

    def _poll_newer(self) -> Schedule | None:
        """The newest schedule if it is newer than the one in use.

        Read from the DHT on each scheduler notice; again every half second while a newer epoch is known to
        exist but the DHT still returns an older one (its replicas lag); and every SCHEDULE_POLL_PERIOD in any
        case, for a peer that joined after the notice of the newest epoch was sent.
        """
        now = time.monotonic()
        known = max(self.schedule.epoch, self._newer.epoch if self._newer is not None else -1)
        since = now - self._last_schedule_poll
        if self._schedule_notice.is_set() or (self._announced_epoch > known and since > 0.5) or \
                since > SCHEDULE_POLL_PERIOD:
            self._schedule_notice.clear()
            self._last_schedule_poll = now
            schedule = self._fetch_schedule()
            if schedule is not None and schedule.epoch > self.schedule.epoch and \
                    (self._newer is None or schedule.epoch > self._newer.epoch):
                self._newer = schedule
        return self._newer

    def _replaced(self) -> bool:
        """A newer epoch starts at (or before) the iteration in progress: that iteration is to be abandoned."""
        newer = self._poll_newer()
        return newer is not None and int(newer.meta.get("start_iteration", 0)) <= self.iteration

    def _adopt_due_schedule(self) -> None:
        newer = self._poll_newer()
        if newer is not None and int(newer.meta.get("start_iteration", 0)) <= self.iteration:
            self._newer = None
            self._adopt(newer)

    def _wait_for_replacement(self, stop: threading.Event) -> bool:
        end = time.monotonic() + COMMIT_TIMEOUT
        while not stop.is_set() and time.monotonic() < end:
            if self._replaced():
                return True
            time.sleep(0.2)
        return False

    def _start_on(self, schedule: Schedule) -> None:
        """First placement: build the worker, from the seed or from a same-stage peer's state."""
        self.schedule, self._newer = schedule, None
        joiner = self.peer_id in schedule.meta.get("joiners", ()) or self.worker is None
        if self.worker is not None and schedule.placement[self.peer_id] != self.stage:
            self.worker = None
        self.stage = schedule.placement[self.peer_id]
        self.iteration = int(schedule.meta.get("start_iteration", 0))
        self._fresh = True  # until its first iteration commits
        if self.worker is None:
            self.worker = self._new_worker(schedule)
        self.worker.reset()
        if self.iteration > 0 and joiner:
            source = self._restore_source(schedule, self.peer_id)
            if source is None:
                steps = load_state(self.worker, self._receive_state())
                logger.info("loaded stage %d's state (step %d) from a same-stage peer", self.stage, steps)
            else:
                self._restore_stage(source, schedule.placement[source])
        self._set_shards(schedule)
        self.state = PeerState.ONLINE
        for k in [k for k in self._buckets if k[1] == "state"]:  # e.g. a neighbour's blocks not needed after all
            del self._buckets[k]
        logger.info("peer %s runs schedule epoch %d on stage %d from iteration %d", self.peer_id, schedule.epoch,
                    self.stage, self.iteration)

    def _new_worker(self, schedule: Schedule) -> StageWorker:
        """A fresh worker for this peer's stage in `schedule` (paced to the emulated device, if any)."""
        split = balanced_split(self.model_config.n_layers, schedule.num_stages)
        kwargs = {"memory_slots": schedule.memory[self.peer_id], "device": self.options.device,
                  "precision": self._precision(), "seed": self.config.seed}
        if self.options.emulate_seconds_per_layer:
            return PacedWorker(self.peer_id, self.stage, self.model_config, split, self.config.optim,
                               seconds_per_layer=self.options.emulate_seconds_per_layer,
                               loss_seconds=self.loss_seconds, **kwargs)
        return StageWorker(self.peer_id, self.stage, self.model_config, split, self.config.optim, **kwargs)

    def _adopt(self, schedule: Schedule) -> None:
        old = self.schedule
        moved = self.peer_id in schedule.placement and schedule.placement[self.peer_id] != self.stage
        handover = schedule.meta.get("handover")
        handover = handover if isinstance(handover, dict) else {}
        source = handover.get(self.peer_id)
        restart = self._restore_source(schedule, self.peer_id) if moved and not isinstance(source, str) else None
        if moved and not isinstance(source, str) and restart is None:
            logger.error("schedule epoch %d moves this peer to stage %d without a peer to take it over from: refused",
                         schedule.epoch, schedule.placement[self.peer_id])
            return
        self.schedule = schedule
        start = int(schedule.meta.get("start_iteration", 0))
        if self._fresh and start < self.iteration:
            # placed from the next iteration, this joiner is in the epoch that reruns the one in progress: it runs
            # that one too (its state is the last commit's, as the rerun's is)
            logger.info("epoch %d reruns iteration %d with this peer: it starts there, not at %d", schedule.epoch,
                        start, self.iteration)
            self.iteration = start
        self._gone = self._gone - frozenset(schedule.placement)  # e.g. a holder restarted with its key
        self._unreachable = frozenset()  # the scheduler's newer view; a peer still unreachable fails again
        self._unreachable_reported = set()  # once per peer and epoch
        # messages of older epochs are void; newer ones (sent by peers that switched first) are kept
        self._buckets = defaultdict(list, {k: kept for k, v in self._buckets.items()
                                           if (kept := [m for m in v if k[1] == "state" or
                                                        m.header.epoch >= schedule.epoch])})
        held, self._held = self._held, []
        for m in held:
            if m.header.epoch > schedule.epoch:
                self._held.append(m)
            elif m.header.epoch == schedule.epoch:
                self._file(m)
        if self.peer_id not in schedule.placement:
            return
        if moved:
            self._move(schedule, source if restart is None else restart, restart=restart is not None)
            self._set_shards(schedule)
            return
        joiners = set(schedule.meta.get("joiners", ()))
        newcomers = [p for p in schedule.stage_peers(self.stage) if p in joiners]
        veterans = [p for p in schedule.stage_peers(self.stage) if p not in joiners and p in old.placement]
        # the first veteran of a stage equips its newcomers; the scheduler names who equips a moved peer and a
        # restarted stage
        receivers = newcomers if veterans and veterans[0] == self.peer_id else []
        receivers += [p for p, src in handover.items() if src == self.peer_id and p in schedule.placement
                      and p not in receivers]
        receivers += [p for p in schedule.placement if p != self.peer_id and p not in receivers
                      and self._restore_source(schedule, p) == self.peer_id]
        for peer in receivers:
            send_state(me=self.peer_id, worker=self.worker, to=peer, run_id=self.options.run_id,
                       iteration=self.iteration, epoch=schedule.epoch, send=self._send)
            logger.info("sent stage %d's state to %s peer %s (stage %d)", self.stage,
                        "joining" if peer in joiners else "moving", peer, schedule.placement.get(peer, -1))
        self._set_shards(schedule)
        logger.info("adopted schedule epoch %d at iteration %d (%d peers)", schedule.epoch, self.iteration,
                    len(schedule.placement))

    def _set_shards(self, schedule: Schedule) -> None:
        """The data shards this holder draws from: its own, plus any taken over from other holders, each at its
        position after the iteration before this one (from that commit, else from the schedule)."""
        if self.stage != 0:
            return
        if self.options.data_paths:
            self.data.use_own_data()
            return
        specs = schedule.meta.get("shards", {}).get(self.peer_id)
        if specs is None:
            specs = [schedule.data_holders.index(self.peer_id)]
        total = int(schedule.meta.get("num_shards", len(schedule.data_holders)))
        planned = schedule.meta.get("shard_positions", {})
        iteration, committed = self._committed_positions
        try:
            self.data.assign(specs, total, {**planned, **committed} if iteration == self.iteration - 1 else planned)
        except ValueError as e:
            logger.error("the scheduler's commit of iteration %d gave a bad data position (%s): using the "
                         "schedule's", iteration, e)
            self.data.assign(specs, total, planned)

    def _receive_state(self, source: str | None = None, timeout: float = COMMIT_TIMEOUT) -> dict[int, Inbound]:
        """The two parts of a stage's state, from a same-stage peer (or from `source`, whatever its stage)."""
        end = time.monotonic() + timeout
        parts: dict[int, Inbound] = {}
        while len(parts) < 2 and time.monotonic() < end:
            for m in self._receive("state", 0.5, any_iteration=True):
                same_stage = m.sender in self.schedule.placement and self.schedule.placement[m.sender] == self.stage
                if m.sender == source or (source is None and same_stage):
                    parts[m.header.microbatch] = m
                else:
                    logger.warning("dropped stage state from %s: not %s", m.sender,
                                   source or f"a peer of stage {self.stage}")
        if len(parts) < 2:
            raise TimeoutError(f"{source or 'no same-stage peer'} sent no state for stage {self.stage} in time")
        return parts

    @staticmethod
    def _restore_source(schedule: Schedule, peer: str) -> str | None:
        """The peer a joiner of a stage that lost every peer starts from (the scheduler's choice), if any."""
        restore = schedule.meta.get("restore")
        source = restore.get(peer) if isinstance(restore, dict) else None
        return source if isinstance(source, str) and source in schedule.placement else None

    def _restore_stage(self, source: str, source_stage: int) -> None:
        """Restart a stage nobody kept serving: from this peer's own checkpoint of it if it has one, else from
        the decoder blocks of `source`, a peer of a neighbouring stage (the optimizer starts afresh)."""
        o = self.options
        if o.checkpoint_dir:
            try:
                manifest = load_stage_checkpoint(o.checkpoint_dir, self.worker)
                logger.warning("stage %d had no peer left: restored it from this peer's checkpoint of iteration %d",
                               self.stage, manifest["iteration"])
                return
            except CheckpointError as e:
                logger.info("no usable checkpoint of stage %d here (%s)", self.stage, e)
        parts = self._receive_state(source)
        split = balanced_split(self.model_config.n_layers, self.schedule.num_stages)
        theirs = unflatten_weights(parts[0].tensor, stage_template(self.model_config, split, source_stage))
        steps = parts[0].header.weight - 1
        load_stage_tensors(self.worker, neighbour_blocks(self.worker.module, theirs), {}, steps=steps)
        logger.warning("stage %d had no peer left and no checkpoint here: initialised it from stage %d's blocks "
                       "(from %s, step %d)", self.stage, source_stage, source, steps)

    def _precision(self) -> str:
        if self.options.precision != "auto":
            return self.options.precision
        return "bf16" if self.options.device.startswith("cuda") else "fp32"

    # ---- one iteration ----------------------------------------------------------------------------
    def _draw(self, schedule: Schedule) -> dict[int, torch.Tensor]:
        """This holder's microbatches for the iteration, in the order it injects them."""
        own = sorted((r for r in schedule.routes if r.origin == self.peer_id),
                     key=lambda r: (r.inject_after, r.microbatch))
        return self.data.draw([r.microbatch for r in own], iteration=self.iteration, epoch=schedule.epoch)

    def _abandon_iteration(self) -> None:
        """Drop the iteration's gradients and stashes; a holder requeues its draws and rewinds its shards."""
        self.worker.reset()
        if self.data is not None:  # a no-op unless it drew for this iteration
            self.data.rewind(self.iteration)
        self._adopt_due_schedule()

    def _run_iteration(self) -> None:
        o, schedule, worker = self.options, self.schedule, self.worker
        batches = self._draw(schedule) if self.stage == 0 else {}
        executor = PipelineExecutor(me=self.peer_id, worker=worker, schedule=schedule, run_id=o.run_id,
                                    iteration=self.iteration, send=self._send, batches=batches,
                                    hold=self._hold, timeline=self.timeline,
                                    gone=lambda: self._gone | self._unreachable,
                                    broken=self._report_broken, give_up=self._report_unrecoverable,
                                    hop_deadlines=self._hop_deadlines(schedule), overdue=self._check_next_hop)
        t0 = time.perf_counter()
        result = executor.run(lambda t: self._receive("hop", t), deadline=self.iteration_deadline(),
                              aborted=lambda: self._replaced() or self._stopping_run(),
                              settled=lambda: (self.iteration, schedule.epoch) in self._commits)
        if self.stage == 0:
            self._tell_scheduler(Done(peer=self.peer_id, iteration=self.iteration, epoch=schedule.epoch,
                                      loss_sum=result.loss_sum, losses=result.losses, tokens=result.tokens,
                                      started=result.started, finished=time.time(), dropped=result.dropped,
                                      shards=self.data.positions()))
        waited = time.time()
        self._wait_for_commit(executor)
        self.timeline.record("commit", waited, time.time(), iteration=self.iteration)
        for mb in worker.stashed:  # committed: every holder's microbatches finished, so these went another way
            logger.info("microbatch %d's stashed forward is dropped: it was re-queued around this peer", mb)
            worker.drop(mb)
        if self.stage == 0:
            for mb, attempt in result.requeued:
                self.data.retried(self.iteration, mb, attempt)
            self.data.commit(self.iteration)
        t1 = time.perf_counter()
        group = schedule.stage_peers(self.stage)
        if self.config.averaging == "hivemind":
            visits, heard = self._average_with_hivemind(len(group))
        else:
            visits, heard = average_stage_group(me=self.peer_id, worker=worker, group=group, run_id=o.run_id,
                                                iteration=self.iteration, epoch=schedule.epoch, send=self._send,
                                                receive=lambda t: self._receive("avg", t),
                                                deadline=o.averaging_deadline, alive=self._worth_waiting_for,
                                                hold=self._hold)
        t2 = time.perf_counter()
        self.timeline.record("average", time.time() - (t2 - t1), time.time(), iteration=self.iteration)
        stats = worker.step()
        t3 = time.perf_counter()
        done = self.iteration + 1
        if o.checkpoint_dir and self.config.checkpoint_every and done % self.config.checkpoint_every == 0:
            save_stage_checkpoint(o.checkpoint_dir, worker, iteration=done, seed=self.config.seed,
                                  shard=self.data.first(),
                                  extra={"run_id": o.run_id, "peer": self.peer_id, "epoch": schedule.epoch})
            logger.info("checkpoint of stage %d at iteration %d written to %s", self.stage, done, o.checkpoint_dir)
        if o.log_param_digest:
            logger.info("params iteration %d stage %d digest %s", self.iteration, self.stage, param_digest(worker))
        self.timeline.flush()
        if getattr(worker, "overruns", 0):
            logger.warning("compute emulation: %d operations so far took longer than the emulated device",
                           worker.overruns)
        if result.detours:
            logger.warning("iteration %d: %d forwards of this peer went around gone peers", self.iteration,
                           result.detours)
        if result.requeued:
            logger.warning("iteration %d: %d microbatches of this holder's were re-queued after a peer on their path "
                           "died", self.iteration, len(result.requeued))
        logger.info("iteration %d done: %d backward passes, stage %d averaged %d visits from %d/%d peers, lr %.2e "
                    "(pipeline+commit %.3f s, averaging %.3f s, step %.3f s)", self.iteration, result.backward_done,
                    self.stage, visits, heard, len(group), stats.lr, t1 - t0, t2 - t1, t3 - t2)

    def iteration_deadline(self) -> float:
        """Seconds to wait for this peer's part of an iteration before reporting it stuck: DEADLINE_FACTOR times
        what iterations take (the schedule's prediction at first, then the median of the recent commit periods,
        which include the slowest peer's averaging), at least MIN_ITERATION_DEADLINE and at most the configured
        cap. A hang (a lost message, a peer dead but not yet expired) is noticed in a minute on a fast swarm,
        not after a fixed five."""
        expected = self._expected_iteration_seconds(self.schedule)
        if not expected > 0:
            return self.options.iteration_deadline
        return min(self.options.iteration_deadline, max(MIN_ITERATION_DEADLINE, DEADLINE_FACTOR * expected))

    def _expected_iteration_seconds(self, schedule: Schedule) -> float:
        """What an iteration takes: the schedule's prediction, or the median of the recent commit periods when
        longer (they include averaging and the slowest peer); 0 if neither is known."""
        expected = schedule.predicted_iteration_seconds or 0.0
        if self._commit_periods:
            expected = max(expected, statistics.median(self._commit_periods[-RECENT_ITERATIONS:]))
        return expected

    def _wait_for_commit(self, executor: PipelineExecutor) -> None:
        """Block until the scheduler commits this iteration; a replacing epoch aborts it instead. Meanwhile keep
        serving the iteration: a detour around a gone peer of this stage may still bring work here."""
        key = (self.iteration, self.schedule.epoch)
        end = time.monotonic() + COMMIT_TIMEOUT
        while key not in self._commits:
            if self._replaced():
                raise IterationAborted(f"iteration {self.iteration} replaced before its commit")
            if self._stopping_run():
                raise IterationAborted(f"iteration {self.iteration} abandoned: the run is stopping")
            if time.monotonic() > end:
                raise IterationTimeout(f"no commit of iteration {self.iteration} within {COMMIT_TIMEOUT:.0f} s")
            executor.handle(self._receive("hop", 0.2))
        self._commits = {c for c in self._commits if c[0] >= self.iteration}
        now = time.monotonic()
        if self._last_commit is not None:
            self._commit_periods = [*self._commit_periods[-RECENT_ITERATIONS:], now - self._last_commit]
        self._last_commit = now

    def _worth_waiting_for(self, peer: str) -> bool:
        """Whether the stage averaging should still wait for `peer`: not gone, reachable, and in the newest epoch."""
        if peer in self._gone or peer in self._unreachable:
            return False
        newer = self._poll_newer()
        return newer is None or peer in newer.placement

    def _average_with_hivemind(self, group_size: int) -> tuple[int, int]:
        """The stage group's visit-weighted mean through hivemind's DecentralizedAverager.

        Its butterfly all-reduce hands each peer `local + (mean - local)`, so peers agree only up to float
        rounding; averaging in float64 keeps that far below float32 resolution.
        """
        from swarm.stage_group.hivemind_averager import StageAverager

        sums = self.worker.gradient_sums()
        own = flatten(sums).double() / max(1, self.worker.visits)
        if group_size < 2:
            self.worker.set_mean_gradients(unflatten(own, sums), self.worker.visits)
            return self.worker.visits, 1
        if self._averager is None:
            self._averager = StageAverager(self.node.dht, run_id=self.options.run_id, stage=self.stage, tensors=[own],
                                           target_group_size=group_size, min_matchmaking_time=1.0)
        result = self._averager.average([own], self.worker.visits, timeout=self.options.averaging_deadline)
        self.worker.set_mean_gradients(unflatten(own, sums), round(result.total_weight))
        return round(result.total_weight), result.group_size

    # ---- messages ---------------------------------------------------------------------------------
    def _on_receive(self, sender: str, header: HopHeader, tensor: torch.Tensor) -> None:
        """Transport thread: hand over to the main loop (the worker is used from one thread only)."""
        if header.sent_at and header.direction in (Direction.FORWARD, Direction.BACKWARD):
            self.jitter.observe(f"{sender}/{header.direction.name}", time.time() - header.sent_at)
        self._raw.put(Inbound(sender, header, tensor))

    def _file(self, m: Inbound | Undelivered | Requeue | None) -> None:
        if m is None:
            return
        if isinstance(m, Requeue):
            if m.iteration == self.iteration:
                self._buckets[(m.iteration, "hop")].append(m)
            return
        it = m.header.iteration
        if isinstance(m, Undelivered):
            if it == self.iteration:
                self._buckets[(it, "hop")].append(m)
            return
        kind = {Direction.AVERAGE: "avg", Direction.STATE: "state"}.get(m.header.direction, "hop")
        if kind == "state":
            # kept even while this peer serves the stage it is for: its sender may have adopted an epoch that moves
            # this peer first; unused, it is dropped an iteration later (`_receive`)
            self._buckets[(it, kind)].append(m)
        elif it < self.iteration and self.schedule is not None and m.header.epoch > self.schedule.epoch:
            self._hold(m)  # an epoch that reruns an earlier iteration: this fresh joiner may run it too
        elif it < self.iteration:
            logger.debug("stale message of iteration %d from %s dropped", it, m.sender)
        elif it > self.iteration + MAX_ITERATIONS_AHEAD:
            logger.warning("dropped a message of iteration %d from %s: this peer is at iteration %d", it, m.sender,
                           self.iteration)
        else:
            self._buckets[(it, kind)].append(m)

    def _receive(self, kind: str, timeout: float, *, any_iteration: bool = False) -> list[Inbound | Undelivered]:
        keys = lambda: [k for k in self._buckets if k[1] == kind and (any_iteration or k[0] == self.iteration)]  # noqa: E731
        if not any(self._buckets[k] for k in keys()):
            try:
                self._file(self._raw.get(timeout=timeout))
            except queue.Empty:
                pass
        while True:
            try:
                self._file(self._raw.get_nowait())
            except queue.Empty:
                break
        online = self.state == PeerState.ONLINE  # a state transfer it did not use is void an iteration later
        for old in [k for k in self._buckets if k[0] < self.iteration - (1 if k[1] == "state" else 0) and
                    (k[1] != "state" or online)]:
            del self._buckets[old]
        out: list[Inbound] = []
        for k in keys():
            out.extend(self._buckets.pop(k, []))
        return out

    def _send(self, peer: str, header: HopHeader, tensor: torch.Tensor) -> Future[bool]:
        """Hand a message to a sender thread; the future says whether it was delivered. A pipeline message that
        was not comes back to the main loop as `Undelivered` (its executor detours it or reports it broken)."""
        plain = header.direction in (Direction.AVERAGE, Direction.STATE) or self.config.wire_dtype == "float32"
        wire = None if plain else self.config.wire_dtype
        if header.direction in (Direction.FORWARD, Direction.BACKWARD):
            header = replace(header, sent_at=time.time())  # before the sender queue: its wait is the link's too

        def deliver() -> bool:
            try:
                start = time.time()
                self._transport.send(peer, header, tensor, wire_dtype=wire)
                self.timeline.record(f"send_{header.direction.name.lower()}", start, time.time(), to=peer,
                                     microbatch=header.microbatch, iteration=header.iteration,
                                     bytes=tensor.numel() * tensor.element_size())
                return True
            except (TransportError, ValueError) as e:
                logger.warning("could not send %s of microbatch %d to %s: %s", header.direction.name.lower(),
                               header.microbatch, peer, e)
                if isinstance(e, PeerUnreachable):
                    self._unreachable = self._unreachable | {peer}
                self._report_unreachable(peer)  # before a broken microbatch is reported: the scheduler drops it then
                if header.direction in (Direction.FORWARD, Direction.BACKWARD):
                    self._raw.put(Undelivered(peer, header, tensor, unreachable=isinstance(e, PeerUnreachable)))
                return False

        return self._sender.submit(deliver)

    def _report_unreachable(self, peer: str) -> None:
        """Tell the scheduler (once per peer and epoch) that `peer` cannot be reached from here."""
        if peer not in self._unreachable_reported and self.node.gossip is not None:
            self._unreachable_reported.add(peer)
            self._tell_scheduler(Unreachable(peer=peer))

    def _hop_deadlines(self, schedule: Schedule) -> dict[int, float]:
        """This peer's per-hop deadlines for `schedule` (see `HOP_DEADLINE_FACTOR`): none if it carries no costs."""
        if self._round_trips[0] != schedule.epoch:
            trips = round_trips(schedule)
            self._round_trips = (schedule.epoch, {mb: t for (p, mb), t in trips.items() if p == self.peer_id})
        predicted = schedule.predicted_iteration_seconds or 0.0
        scale = self._expected_iteration_seconds(schedule) / predicted if predicted > 0 else 1.0
        return {mb: HOP_DEADLINE_FACTOR * t * scale + HOP_DEADLINE_SLACK for mb, t in self._round_trips[1].items()}

    def _check_next_hop(self, peer: str, microbatch: int) -> None:
        """A microbatch sent to `peer` is overdue: probe `peer` off the main loop. One that does not answer is
        taken for gone (the executor reports the microbatch broken, the scheduler hears that it is unreachable);
        one that answers is slow, or waits on a hop further on, whose own upstream peer checks it."""
        def check() -> None:
            try:
                self._transport.probe(peer, 1, timeout=HOP_CHECK_TIMEOUT)
                logger.info("microbatch %d is late but %s answers: waiting on", microbatch, peer)
            except TransportError as e:
                logger.warning("microbatch %d is overdue at %s, which does not answer (%s): taking it for gone",
                               microbatch, peer, e)
                self._unreachable = self._unreachable | {peer}
                self._report_unreachable(peer)
                self._raw.put(None)  # wake the main loop: the executor finds the microbatch broken

        self._sender.submit(check)

    def _report_broken(self, report: Requeue) -> None:
        """An attempt of another holder's microbatch cannot finish here: tell its holder (it re-queues it) and the
        scheduler (it takes the gone peer out)."""
        self._tell_scheduler(Broken(peer=self.peer_id, iteration=report.iteration, epoch=report.epoch,
                                    microbatch=report.microbatch, attempt=report.attempt, gone=report.gone,
                                    maybe_ran=report.maybe_ran, why=report.why[:200]))

    def _report_unrecoverable(self, microbatch: int, why: str) -> None:
        """This holder cannot re-queue a microbatch: the scheduler runs the iteration again."""
        self._tell_scheduler(Unrecoverable(peer=self.peer_id, iteration=self.iteration, epoch=self.schedule.epoch,
                                           microbatch=microbatch, why=why[:200]))
