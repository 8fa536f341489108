"""`Peer`: a volunteer's process in a run, from joining to leaving.

Joins the DHT through any known peer, reads the signed run spec, measures its own compute speed and its
links to a sample of peers, and announces itself (a signed record refreshed by heartbeat). Once the
coordinator's schedule places it, it builds its stage's worker (weights from the run's seed, so every
peer of a stage starts equal), then iterates: its part of the pipeline (`PipelineExecutor`), the stage
group's averaging (`average_stage_group`), one optimizer step; data holders report progress on the
gossip control plane. A newer schedule epoch is adopted at the iteration boundary it names. On stop
(Ctrl+C, SIGTERM or the run's last iteration) it announces that it leaves and shuts everything down.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import statistics
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import hivemind
import torch

from peers.checkpoint import save_stage_checkpoint
from peers.data import Corpus
from peers.model import Block, ModelConfig
from peers.stage import balanced_split
from peers.worker import StageWorker
from scheduler.schedule import Schedule
from swarm.constants import DHT_TIMEOUT, LOOPBACK_HOST
from swarm.gossip import GossipClient, GossipMessage, membership_topic, progress_topic, schedule_topic
from swarm.identity import ensure_identity, load_identity
from swarm.link_probe import LinkProber
from swarm.pipeline import Inbound, PipelineExecutor
from swarm.records import SwarmRecords
from swarm.run_config import RunConfig
from swarm.stage_allgather import average_stage_group, flatten, unflatten
from swarm.transport import Transport, TransportError
from swarm.wire import Direction, HopHeader, PeerRecord, PeerState, WireError

logger = logging.getLogger(__name__)

MAX_ITERATIONS_AHEAD = 2
"""Messages for iterations further ahead than this are refused, so a flood cannot fill memory."""
PROBE_SAMPLE = 8
"""Peers whose links a joining peer measures."""


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
    """Seconds one iteration may take before this peer gives up on it."""
    averaging_deadline: float = 60.0
    join_timeout: float = 120.0
    """Seconds to wait for the run spec and for a schedule that places this peer."""
    log_gossip: str | None = None
    checkpoint_dir: str | None = None
    """Where this peer writes its own checkpoint every `checkpoint_every` iterations of the run."""
    log_param_digest: bool = False
    """Log a digest of the stage's parameters after every step (to check that a stage group agrees)."""


def measure_seconds_per_layer(model: ModelConfig, batch_size: int, seq_len: int, device: str,
                              repeats: int = 5) -> float:
    """Median forward time of one decoder block for one microbatch on this machine (its compute speed)."""
    torch.manual_seed(0)
    block = Block(model).to(device)
    x = torch.randn(batch_size, seq_len, model.dim, device=device, requires_grad=True)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        y = block(x)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        y.sum().backward()
    return max(statistics.median(times[1:]), 1e-6)


def param_digest(worker: StageWorker) -> str:
    """sha256 of the stage's parameters, in name order (equal digests = bit-identical weights)."""
    h = hashlib.sha256()
    for name, p in sorted(worker.module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class Peer:
    """One peer process. `run(stop)` blocks until the run ends or `stop` is set."""

    def __init__(self, options: PeerOptions) -> None:
        self.options = options
        self.peer_id = ensure_identity(options.identity_path)
        self.identity = load_identity(options.identity_path)
        self.iteration = 0
        self.stage = -1 if options.stage is None else options.stage  # announced: the planner pins it there
        self.state = PeerState.JOINING
        self.schedule: Schedule | None = None
        self.worker: StageWorker | None = None
        self.links: dict[str, tuple[float, float]] = {}
        self.seconds_per_layer = 1.0
        self._raw: queue.Queue[Inbound] = queue.Queue()
        self._buckets: dict[tuple[int, str], list[Inbound]] = defaultdict(list)
        self._sender = ThreadPoolExecutor(4, thread_name_prefix="skippipe-send")
        self._schedule_notice = threading.Event()
        self._dht = self._transport = self._gossip = self._heartbeat = self._averager = None
        self.records: SwarmRecords | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        try:
            self._join(stop)
            if self.schedule is None:
                return
            while not stop.is_set() and (not self.config.iterations or self.iteration < self.config.iterations):
                self._maybe_adopt_newer_schedule()
                self._run_iteration()
                self.iteration += 1
            logger.info("peer %s stops after iteration %d", self.peer_id, self.iteration)
        finally:
            self.shutdown()

    def _join(self, stop: threading.Event) -> None:
        o = self.options
        self._dht = hivemind.DHT(initial_peers=list(o.initial_peers), host_maddrs=[f"/ip4/{o.host}/tcp/{o.port}"],
                                 identity_path=o.identity_path, start=True)
        self.records = SwarmRecords(self._dht, self.identity, o.run_id)
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
        self.coordinator = spec.coordinator
        self._transport = Transport(self._dht, self._on_receive, run_id=o.run_id)
        self._gossip = GossipClient(on_message=self._on_gossip)
        self._gossip.start(o.identity_path, listen_host=o.host, bootstrap=spec.control_addrs, log_path=o.log_gossip)
        for topic in (schedule_topic(o.run_id), membership_topic(o.run_id)):
            self._gossip.subscribe(topic)
        self.corpus = Corpus.build(self.config.data)
        if self.corpus.vocab_size != self.model_config.vocab_size:
            raise ValueError(f"tokenizer has {self.corpus.vocab_size} tokens, the run spec says "
                             f"{self.model_config.vocab_size}")
        if o.data_paths:
            self.corpus = self.corpus.with_documents(o.data_paths)
        self.seconds_per_layer = measure_seconds_per_layer(self.model_config, self.config.data.batch_size,
                                                           self.config.data.seq_len, o.device)
        self._heartbeat = self.records.start_heartbeat(self._record)
        self._probe_links()
        self._gossip.publish(membership_topic(o.run_id), {"event": "join", "peer": self.peer_id}, wait=False)
        logger.info("peer %s joined run %s (%.4f s/layer); waiting to be placed", self.peer_id, o.run_id,
                    self.seconds_per_layer)
        while not stop.is_set() and time.monotonic() < deadline:
            schedule = self._fetch_schedule()
            if schedule is not None and self.peer_id in schedule.placement:
                self._adopt(schedule, first=True)
                return
            self._schedule_notice.wait(0.5)
            self._schedule_notice.clear()
        if not stop.is_set():
            raise TimeoutError("no schedule placed this peer in time")

    def shutdown(self) -> None:
        """Announce leaving, then stop heartbeat, gossip, transport and DHT (each only if it was started)."""
        if self._heartbeat is not None:
            self.state = PeerState.LEAVING
            try:
                self._heartbeat.stop(leave=True)
            except Exception as e:  # the DHT may already be unreachable
                logger.warning("could not announce leaving: %s", e)
            self._heartbeat = None
        if self._gossip is not None:
            try:
                self._gossip.publish(membership_topic(self.options.run_id), {"event": "leave", "peer": self.peer_id},
                                     timeout=2)
            except Exception as e:
                logger.debug("leave notice not sent: %s", e)
            self._gossip.close()
            self._gossip = None
        self._sender.shutdown(wait=True, cancel_futures=True)
        if self._averager is not None:
            self._averager.shutdown()
            self._averager = None
        if self._transport is not None:
            self._transport.shutdown()
            self._transport = None
        if self._dht is not None:
            self._dht.shutdown()
            self._dht = None

    # ---- announcements ----------------------------------------------------------------------------
    def _record(self) -> PeerRecord:
        return PeerRecord(peer_id=self.peer_id, stage=self.stage, seconds_per_layer=self.seconds_per_layer,
                          memory_slots=self.config.memory, links=dict(self.links),
                          addresses=tuple(str(a) for a in self._dht.get_visible_maddrs()), state=self.state,
                          data_holder=bool(self.options.data_paths))

    def _probe_links(self) -> None:
        """Measure latency and goodput to a sample of peers already announced (the planner's cost matrix)."""
        try:
            others = [p for p in self.records.fetch_peers() if p != self.peer_id][:PROBE_SAMPLE]
            prober = LinkProber(self._transport, sample_size=PROBE_SAMPLE)
            self.links = prober.probe_round(others)
        except (TransportError, WireError, TimeoutError) as e:
            logger.warning("link probing failed: %s", e)

    # ---- schedules --------------------------------------------------------------------------------
    def _on_gossip(self, msg: GossipMessage) -> None:
        if msg.topic == schedule_topic(self.options.run_id):
            if msg.sender != self.coordinator:
                logger.warning("ignored a schedule notice from %s: not the run's scheduler", msg.sender)
                return
            self._schedule_notice.set()

    def _fetch_schedule(self) -> Schedule | None:
        msg = self.records.fetch_schedule(signers=[self.coordinator])
        return msg.to_schedule() if msg is not None else None

    def _maybe_adopt_newer_schedule(self) -> None:
        if not self._schedule_notice.is_set():
            return
        self._schedule_notice.clear()
        schedule = self._fetch_schedule()
        if schedule is None or schedule.epoch <= self.schedule.epoch:
            return
        start = int(schedule.meta.get("start_iteration", 0))
        if start > self.iteration:
            self._schedule_notice.set()  # not yet: look again at the next boundary
            return
        if schedule.placement.get(self.peer_id) != self.stage:
            logger.error("schedule epoch %d moves this peer to stage %s; moving stages is not supported yet",
                         schedule.epoch, schedule.placement.get(self.peer_id))
            return
        self._adopt(schedule)

    def _adopt(self, schedule: Schedule, *, first: bool = False) -> None:
        self.schedule = schedule
        if first:
            self.stage = schedule.placement[self.peer_id]
            split = balanced_split(self.model_config.n_layers, schedule.num_stages)
            self.worker = StageWorker(self.peer_id, self.stage, self.model_config, split, self.config.optim,
                                      memory_slots=schedule.memory[self.peer_id], device=self.options.device,
                                      precision=self._precision(), seed=self.config.seed)
            self.iteration = int(schedule.meta.get("start_iteration", 0))
            if self.stage == 0:
                holders = schedule.data_holders
                index, count = (0, 1) if self.options.data_paths else (holders.index(self.peer_id), len(holders))
                self.shard = self.corpus.shard(index, count)
            self.state = PeerState.ONLINE
        logger.info("peer %s runs schedule epoch %d on stage %d from iteration %d", self.peer_id, schedule.epoch,
                    self.stage, self.iteration)

    def _precision(self) -> str:
        if self.options.precision != "auto":
            return self.options.precision
        return "bf16" if self.options.device.startswith("cuda") else "fp32"

    # ---- one iteration ----------------------------------------------------------------------------
    def _run_iteration(self) -> None:
        o, schedule, worker = self.options, self.schedule, self.worker
        batches = {}
        if self.stage == 0:
            own = sorted((r for r in schedule.routes if r.origin == self.peer_id),
                         key=lambda r: (r.inject_after, r.microbatch))
            batches = {r.microbatch: self.shard.next_batch() for r in own}
        executor = PipelineExecutor(me=self.peer_id, worker=worker, schedule=schedule, run_id=o.run_id,
                                    iteration=self.iteration, send=self._send, batches=batches)
        t0 = time.perf_counter()
        result = executor.run(lambda t: self._receive("hop", t), deadline=o.iteration_deadline)
        t1 = time.perf_counter()
        group = schedule.stage_peers(self.stage)
        if self.config.averaging == "hivemind":
            visits, heard = self._average_with_hivemind(len(group))
        else:
            visits, heard = average_stage_group(me=self.peer_id, worker=worker, group=group, run_id=o.run_id,
                                                iteration=self.iteration, epoch=schedule.epoch, send=self._send,
                                                receive=lambda t: self._receive("avg", t),
                                                deadline=o.averaging_deadline)
        t2 = time.perf_counter()
        stats = worker.step()
        t3 = time.perf_counter()
        done = self.iteration + 1
        if o.checkpoint_dir and self.config.checkpoint_every and done % self.config.checkpoint_every == 0:
            save_stage_checkpoint(o.checkpoint_dir, worker, iteration=done, seed=self.config.seed,
                                  shard=getattr(self, "shard", None),
                                  extra={"run_id": o.run_id, "peer": self.peer_id, "epoch": schedule.epoch})
            logger.info("checkpoint of stage %d at iteration %d written to %s", self.stage, done, o.checkpoint_dir)
        if o.log_param_digest:
            logger.info("params iteration %d stage %d digest %s", self.iteration, self.stage, param_digest(worker))
        if self.stage == 0 and self._gossip is not None:
            report = {"peer": self.peer_id, "iteration": self.iteration, "epoch": schedule.epoch,
                      "loss_sum": result.loss_sum, "losses": result.losses, "tokens": result.tokens,
                      "started": result.started, "finished": time.time(), "dropped": result.dropped,
                      "lr": stats.lr}
            try:
                self._gossip.publish(progress_topic(o.run_id), report, wait=False)
            except Exception as e:
                logger.warning("progress report not sent: %s", e)
        logger.info("iteration %d done: %d backward passes, stage %d averaged %d visits from %d/%d peers "
                    "(pipeline %.3f s, averaging %.3f s, step %.3f s)", self.iteration, result.backward_done,
                    self.stage, visits, heard, len(group), t1 - t0, t2 - t1, t3 - t2)

    def _average_with_hivemind(self, group_size: int) -> tuple[int, int]:
        """The stage group's visit-weighted mean through hivemind's DecentralizedAverager.

        Its butterfly all-reduce hands each peer `local + (mean - local)`, so peers agree only up to float
        rounding; averaging in float64 keeps that far below float32 resolution.
        """
        from swarm.averaging import StageAverager

        sums = self.worker.gradient_sums()
        own = flatten(sums).double() / max(1, self.worker.visits)
        if group_size < 2:
            self.worker.set_mean_gradients(unflatten(own, sums), self.worker.visits)
            return self.worker.visits, 1
        if self._averager is None:
            self._averager = StageAverager(self._dht, run_id=self.options.run_id, stage=self.stage, tensors=[own],
                                           target_group_size=group_size, min_matchmaking_time=1.0)
        result = self._averager.average([own], self.worker.visits, timeout=self.options.averaging_deadline)
        self.worker.set_mean_gradients(unflatten(own, sums), round(result.total_weight))
        return round(result.total_weight), result.group_size

    # ---- messages ---------------------------------------------------------------------------------
    def _on_receive(self, sender: str, header: HopHeader, tensor: torch.Tensor) -> None:
        """Transport thread: hand over to the main loop (the worker is used from one thread only)."""
        self._raw.put(Inbound(sender, header, tensor))

    def _file(self, m: Inbound) -> None:
        it = m.header.iteration
        if it < self.iteration:
            logger.debug("stale message of iteration %d from %s dropped", it, m.sender)
        elif it > self.iteration + MAX_ITERATIONS_AHEAD:
            logger.warning("dropped a message of iteration %d from %s: this peer is at iteration %d", it, m.sender,
                           self.iteration)
        else:
            self._buckets[(it, "avg" if m.header.direction == Direction.AVERAGE else "hop")].append(m)

    def _receive(self, kind: str, timeout: float) -> list[Inbound]:
        key = (self.iteration, kind)
        if not self._buckets.get(key):
            try:
                self._file(self._raw.get(timeout=timeout))
            except queue.Empty:
                pass
        while True:
            try:
                self._file(self._raw.get_nowait())
            except queue.Empty:
                break
        for old in [k for k in self._buckets if k[0] < self.iteration]:
            del self._buckets[old]
        return self._buckets.pop(key, [])

    def _send(self, peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
        wire = None if header.direction == Direction.AVERAGE or self.config.wire_dtype == "float32" \
            else self.config.wire_dtype

        def deliver() -> None:
            try:
                self._transport.send(peer, header, tensor, wire_dtype=wire)
            except (TransportError, ValueError) as e:
                logger.warning("could not send %s of microbatch %d to %s: %s", header.direction.name.lower(),
                               header.microbatch, peer, e)

        self._sender.submit(deliver)
