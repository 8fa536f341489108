"""`Coordinator`: starts a run, plans it from the live swarm, commits its iterations and reports progress.

Bootstraps the DHT, publishes the signed run spec (with its gossip address, where peers join the control
plane), and prints the address peers join with. Once `min_peers` peers have announced themselves, it
builds the scheduler's view from their signed records (measured compute speed, memory, probed links),
places them and plans every microbatch's path, then signs and stores the schedule in the DHT and
announces the epoch on gossip.

Each iteration, data holders report `done`; when all of the current epoch's holders have, the coordinator
publishes `commit` (peers then average and step) and writes one swarm-wide line (loss, tokens/s, iteration
time, peers online, epoch) to its log and metrics file. It watches the peers' heartbeats: when a scheduled
peer's record expires (or it announces that it leaves) it re-plans without it, incrementally, as a new
epoch that restarts the uncommitted iteration, handing a departed data holder's shards (at their last
committed position) to the surviving holders; a peer that joins is placed where it helps most from the
next iteration on.
"""

from __future__ import annotations

import json
import logging
import queue
import statistics
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import hivemind
import numpy as np

from peers.data import Corpus
from peers.model import ModelConfig
from peers.stage import balanced_split, stage_template
from scheduler.constants import LOSS_FACTOR
from scheduler.costs import CostTables, jitter_quantiles, pooled_jitter, tables_from_dict
from scheduler.path_rules import PathRules, rules_around
from scheduler.placement import PlacementGoal, movers_to, place_after_departure, place_joining, rebalance
from scheduler.planner import REPLAN_JITTER_POLISH, PlanOptions, baseline_schedule, plan, plan_tables
from scheduler.profiles import swarm_from
from scheduler.schedule import Schedule, validate
from scheduler.swarm_view import ModelCost, PeerSpec, SwarmView
from swarm.constants import LOOPBACK_HOST, RUN_SPEC_TTL
from swarm.control.gossip import GossipClient, GossipMessage, membership_topic, progress_topic, schedule_topic
from swarm.control.records import SwarmRecords
from swarm.coordinator.shard_assignment import assign_shards, shard_drawers, shards_to_injectors
from swarm.coordinator.unreachable_reports import UnreachableReports
from swarm.net.dht_shutdown import stop_dht
from swarm.net.identity import ensure_identity, load_identity
from swarm.net.link_probe import link_matrices, links_complete, unmeasured_links
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord, PeerState, ScheduleMsg

logger = logging.getLogger(__name__)

SETTLE_SECONDS = 2.0
"""After the last new peer announced itself, wait this long (for its link probes) before planning."""
JOIN_PROBE_SECONDS = 60.0
"""A peer joining mid-run is placed once its record shows its first round of link probes (it is ready to work,
and the planner knows its links), or after this long without them."""
LINK_WAIT_SECONDS = 30.0
"""Before the first plan, wait at most this long for the peers to have measured every link (a large swarm
probes a sample of its links only, and plans with the gaps filled)."""
WIRE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
BASELINE_METHODS = {"full-pipeline": "full_pipeline", "random-skip": "random_skip"}
"""`swarm.planner` baselines -> `baseline_schedule`'s method, which their schedules carry as `planner`."""


@dataclass(frozen=True)
class CoordinatorOptions:
    config: RunConfig
    identity_path: str
    host: str = LOOPBACK_HOST
    port: int = 0
    run_dir: str | None = None
    """Where the address file (coordinator.json), the schedules and the metrics go."""
    metrics_path: str | None = None
    """One JSON line per iteration (default: run_dir/metrics.jsonl)."""
    first_schedule: Schedule | None = None
    """A saved plan of these peers (an earlier run's `schedule-N.json`) to start from instead of planning: a run
    restarted on the same machines keeps its placement, and two runs compared on one plan differ only in what
    happens during them. Used once every peer it places is live; a fresh plan if they are not within
    `LINK_WAIT_SECONDS`, or if a peer pins another stage."""


def saved_plan_mismatch(schedule: Schedule, config: RunConfig) -> str | None:
    """Why a saved plan cannot start a run of `config` (None if it can)."""
    planner = BASELINE_METHODS.get(config.planner) or \
        ("skippipe" if config.planner == "skippipe" else "skippipe_without_collision_awareness")
    if schedule.num_stages != config.stages:
        return f"it has {schedule.num_stages} stages, the run {config.stages}"
    if schedule.planner != planner:
        return f"it was made by the {schedule.planner!r} planner, the run plans with {config.planner!r}"
    return None


def view_from_records(records: dict[str, PeerRecord]) -> SwarmView:
    """The scheduler's view of the swarm from the peers' own (signed, measured) records."""
    order = sorted(records)
    peers = [PeerSpec(id=p, seconds_per_layer=records[p].seconds_per_layer, memory_slots=records[p].memory_slots,
                      data_holder=records[p].data_holder, loss_seconds=records[p].loss_seconds,
                      message_jitter=records[p].jitter) for p in order]
    lat, bw = link_matrices(records, order, default_latency=0.001, default_bandwidth=1e9)
    # measured latency already includes the per-message cost of the transport
    return SwarmView(peers=peers, latency=lat, bandwidth=bw, message_overhead=0.0)


class Coordinator:
    """One coordinator process. `run(stop)` blocks until the run's last iteration is reported or `stop` is set."""

    def __init__(self, options: CoordinatorOptions) -> None:
        self.options = options
        self.config = options.config
        self.peer_id = ensure_identity(options.identity_path)
        self.identity = load_identity(options.identity_path)
        self._init_state(run_dir=options.run_dir, metrics_path=options.metrics_path)
        self._dht = self._gossip = self._heartbeat = None

    def _init_state(self, *, run_dir: str | None, metrics_path: str | None) -> None:
        self.schedule: Schedule | None = None
        """The newest epoch published."""
        self.schedules: list[Schedule] = []
        """Every epoch published, oldest first."""
        self.completed = 0
        """Iterations committed; the one in progress is `completed`."""
        self.peers_online = 0
        self._reports: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
        self.shard_positions: dict[str, Any] = {}
        """Shard index -> its data position after the last committed iteration (for handing it over)."""
        self._first_seen: dict[str, float] = {}
        self._last_seen: dict[str, float] = {}
        self._leaving: set[str] = set()
        self._records: dict[str, PeerRecord] = {}
        self._heartbeat_age: dict[str, float] = {}
        """Seconds since each peer's latest heartbeat, as of the last DHT read."""
        self._unreachable = UnreachableReports(self.config.heartbeat)
        self._declared_gone: set[str] = set()
        """Peers declared gone on corroborated unreachable reports, before their records expire."""
        self._restarted: set[tuple[int, int]] = set()
        self._param_bytes: tuple[int, ...] | None = None
        self._gossip_inbox: queue.Queue[GossipMessage] = queue.Queue()
        self.run_dir = Path(run_dir) if run_dir else None
        metrics = metrics_path or (str(self.run_dir / "metrics.jsonl") if self.run_dir else None)
        self.metrics_path = Path(metrics) if metrics else None
        self._last_count, self._settled_since = 0, time.monotonic()
        self._local = None

    def run(self, stop: threading.Event) -> None:
        try:
            self._start()
            last_spec = time.monotonic()
            while not stop.is_set() and not self.done:
                if time.monotonic() - last_spec > RUN_SPEC_TTL / 3:
                    self.records.publish_run_spec(self.spec)
                    last_spec = time.monotonic()
                self.tick()
            self.finish(stop)
        finally:
            self.shutdown()

    @classmethod
    def take_over(cls, *, config: RunConfig, spec: Any, peer_id: str, records: SwarmRecords, gossip: GossipClient,
                  schedules: list[Schedule], completed: int, metrics_path: str | None,
                  local: Any = None) -> Coordinator:
        """The scheduler role inside a peer that succeeds a dead coordinator: same logic, the peer's DHT and gossip.

        It restarts the iteration in progress under a new epoch of its own, so every holder reports it again to
        the new scheduler.
        """
        self = cls.__new__(cls)
        self.options, self.config, self.peer_id = None, config, peer_id
        self._init_state(run_dir=None, metrics_path=metrics_path)
        self.spec, self.records, self._gossip, self._dht = spec, records, gossip, None
        self._local = local
        self.schedules = sorted(schedules, key=lambda x: x.epoch)
        self.schedule = self.schedules[-1]
        self.completed = completed
        self.shard_positions = dict(self.schedule.meta.get("shard_positions", {}))
        peers = self._live_peers()
        self.publish_schedule(self.replan({p: r for p, r in peers.items() if p in self.schedule.placement},
                                          start_iteration=completed))
        return self

    def tick(self) -> None:
        """One round: watch membership, plan or re-plan, handle reports."""
        peers = self._live_peers()
        self.peers_online = len(peers)
        if self.schedule is None:
            if len(peers) != self._last_count:
                self._last_count, self._settled_since = len(peers), time.monotonic()
            settled = time.monotonic() - self._settled_since
            if len(peers) >= self.config.min_peers and settled >= SETTLE_SECONDS and \
                    (self.config.profile or links_complete(peers) or settled >= LINK_WAIT_SECONDS):
                first = self._first_plan(peers, settled)
                if first is not None:
                    self.publish_schedule(first)
        else:
            self._follow_membership(peers)
        self._drain_gossip(timeout=0.5)

    def finish(self, stop: threading.Event) -> None:
        """The run reached its last iteration, or its operator stopped the coordinator: either way the run is over,
        and peers are told so (they leave at once). A coordinator that dies without a word is replaced instead, and
        so is a peer holding the scheduler role that leaves: its run goes on."""
        if self.done:
            logger.info("run %s finished: %d iterations", self.config.run_id, self.completed)
            self._publish(membership_topic(self.config.run_id), {"event": "finished",
                                                                        "iterations": self.completed})
            self._linger(stop)
        elif stop.is_set() and self.options is not None and self._gossip is not None:
            logger.info("run %s stopped after %d iterations", self.config.run_id, self.completed)
            self._publish(membership_topic(self.config.run_id), {"event": "finished", "iterations": self.completed,
                                                                        "stopped": True})

    def _linger(self, stop: threading.Event, timeout: float = 30.0) -> None:
        """Stay on the control plane until the peers have taken the last commit and left."""
        end = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < end:
            if not any(p in self.schedule.placement for p in self._live_peers()):
                return
            self._drain_gossip(timeout=0.5)

    @property
    def done(self) -> bool:
        return bool(self.config.iterations) and self.completed >= self.config.iterations

    def _start(self) -> None:
        o = self.options
        if self.run_dir:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self._dht = hivemind.DHT(host_maddrs=[f"/ip4/{o.host}/tcp/{o.port}"], identity_path=o.identity_path,
                                 start=True)
        self.records = SwarmRecords(self._dht, self.identity, self.config.run_id)
        corpus = Corpus.build(self.config.data)  # trains (and caches) the run's tokenizer once
        self._gossip = GossipClient(on_message=self._gossip_inbox.put)
        info = self._gossip.start(o.identity_path, listen_host=o.host)
        for topic in (progress_topic(self.config.run_id), membership_topic(self.config.run_id),
                      schedule_topic(self.config.run_id)):
            self._gossip.subscribe(topic)
        self.spec = self.config.to_spec(coordinator=self.peer_id, vocab_size=corpus.vocab_size,
                                        control_addrs=tuple(info.maddrs))
        if not self.records.publish_run_spec(self.spec):
            raise RuntimeError("could not store the run spec in the DHT")
        # a heartbeat of its own, so that peers notice when the coordinator is gone and elect a successor
        self._heartbeat = self.records.start_heartbeat(
            lambda: PeerRecord(peer_id=self.peer_id, stage=-1, seconds_per_layer=1.0, memory_slots=1,
                               state=PeerState.ONLINE, control_addrs=tuple(info.maddrs)),
            period=self.config.heartbeat, ttl=3 * self.config.heartbeat)
        self.initial_peers = [str(a) for a in self._dht.get_visible_maddrs()]
        if self.run_dir:
            (self.run_dir / "coordinator.json").write_text(json.dumps(
                {"run_id": self.config.run_id, "initial_peers": self.initial_peers, "coordinator": self.peer_id}))
        logger.info("run %s started; peers join with: skippipe-peer join --run %s --initial-peers %s",
                    self.config.run_id, self.config.run_id, self.initial_peers[0])

    def shutdown(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop(leave=True)
            self._heartbeat = None
        if self._gossip is not None:
            self._gossip.close()
            self._gossip = None
        if self._dht is not None:
            stop_dht(self._dht)
            self._dht = None

    # ---- planning ---------------------------------------------------------------------------------
    def _live_peers(self) -> dict[str, PeerRecord]:
        """Peers whose signed record was seen within three heartbeats, who have not announced leaving and whom
        the peers' reports do not show dead (`UnreachableReports`).

        One DHT read can miss a record on a busy swarm, so a peer counts as gone only once its record has been
        absent for longer than its lifetime, it said it leaves, or peers that cannot reach it corroborate it.
        """
        now = time.monotonic()
        records = self.records.fetch_peers_with_age(3 * self.config.heartbeat)
        for p, (r, age) in records.items():
            if r.state == PeerState.LEAVING:
                self._leaving.add(p)
            self._last_seen[p] = now
            self._records[p], self._heartbeat_age[p] = r, age
        self._judge_unreachable(now)
        grace = 3 * self.config.heartbeat + 2.0
        return {p: r for p, r in self._records.items()
                if p not in self._leaving and p not in self._declared_gone and p != self.spec.coordinator
                and now - self._last_seen[p] <= grace}

    def _note_unreachable(self, msg: GossipMessage) -> None:
        """A peer of the schedule could not open a stream to another one."""
        target = msg.payload.get("peer")
        if self.schedule is None or not isinstance(target, str) or target not in self.schedule.placement or \
                msg.sender not in self.schedule.placement or msg.sender in self._declared_gone:
            return
        now = time.monotonic()
        self._unreachable.report(msg.sender, target, now)
        self._judge_unreachable(now)

    def _judge_unreachable(self, now: float) -> None:
        """Declare gone the peers that corroborated reports show unreachable; take back those that rejoined."""
        for p in list(self._declared_gone):
            record = self._records.get(p)
            if record is not None and record.state == PeerState.JOINING:  # alive after all: it asks to be placed
                logger.info("%s, declared gone, asks to be placed again", p)
                self._declared_gone.discard(p)
                self._unreachable.forget(p)
        for p, why in self._unreachable.gone(self._heartbeat_age, now).items():
            self._declare_gone(p, why)

    def _declare_gone(self, peer: str, why: str) -> None:
        """Take `peer` for gone before its record expires (the next DHT read leaves it out)."""
        logger.warning("%s is gone: %s", peer, why)
        self._declared_gone.add(peer)
        self._unreachable.forget(peer)

    def _model_cost(self, peers: dict[str, PeerRecord]) -> ModelCost:
        """The model's costs: layers per stage, bytes per message, and the loss step relative to the stage-0
        forward as the peers measured it (it depends on the vocabulary, which a decoder block does not show)."""
        cfg, model = self.config, self.spec.model
        layers = balanced_split(model["n_layers"], cfg.stages)
        activation = cfg.data.batch_size * cfg.data.seq_len * model["dim"] * WIRE_BYTES[cfg.wire_dtype]
        ratios = [r.loss_seconds / (r.seconds_per_layer * max(1, layers[0])) for r in peers.values()
                  if r.loss_seconds > 0]
        loss_factor = statistics.median(ratios) if ratios else LOSS_FACTOR
        if self._param_bytes is None:  # what each stage group averages (float32 gradients), for placement
            config = ModelConfig.from_dict(model)
            self._param_bytes = tuple(4 * sum(shape.numel() for shape in stage_template(config, layers, s).values())
                                      for s in range(cfg.stages))
        return ModelCost(layers_per_stage=tuple(layers), activation_bytes=activation, loss_factor=loss_factor,
                         stage_param_bytes=self._param_bytes)

    def _first_plan(self, peers: dict[str, PeerRecord], settled: float) -> Schedule | None:
        """Epoch 0: the saved plan once every peer it places is live (None while waiting for them), else a fresh
        plan."""
        saved = self.options.first_schedule if self.options is not None else None
        if saved is not None:
            missing = sorted(set(saved.placement) - set(peers))
            moved = sorted(p for p, s in saved.placement.items() if p in peers and peers[p].stage not in (-1, s))
            if not missing and not moved:
                return self._started_from(saved, peers)
            if not moved and settled < LINK_WAIT_SECONDS:
                return None
            logger.warning("not starting from the saved plan: %s; planning afresh",
                           f"{len(missing)} of its peers are not here: {missing[:5]}" if missing else
                           f"peers pin other stages than it places them on: {moved[:5]}")
        missing_links = [] if self.config.profile else unmeasured_links(peers)
        if missing_links:
            logger.warning("planning with %d of %d links not yet measured (taken as the median link): %s",
                           len(missing_links), len(peers) * (len(peers) - 1) // 2, missing_links[:5])
        return self.plan(peers, epoch=0, start_iteration=0)

    def _started_from(self, saved: Schedule, peers: dict[str, PeerRecord]) -> Schedule:
        """The saved plan as this run's epoch 0 (peers that are not in it join through a re-plan)."""
        holders = saved.data_holders
        shards = self._injected_shards(saved, {h: [i] for i, h in enumerate(holders)}, peers)
        schedule = replace(saved, epoch=0, run_id=self.config.run_id,
                           meta={**saved.meta, "start_iteration": 0, "num_shards": len(holders),
                                 "shards": shards, "shard_positions": {},
                                 "saved_plan": True, "plan_seconds": 0.0})
        validate(schedule)
        logger.info("starting from the saved plan (%d peers, planned by %s)", len(schedule.placement),
                    schedule.planner)
        return schedule

    def plan(self, peers: dict[str, PeerRecord], *, epoch: int, start_iteration: int) -> Schedule:
        """Place `peers` and plan their paths (on the measured view, or on the configured profile)."""
        cfg = self.config
        cost = self._model_cost(peers)
        view = self._view(peers)
        rules = PathRules.from_skip_ratio(cfg.stages, cfg.skip)
        pinned = {p: r.stage for p, r in peers.items() if r.stage >= 0}
        schedule = plan(view, cost, rules, self._plan_options(), epoch=epoch, run_id=cfg.run_id,
                        placement=pinned or None)
        schedule = self._as_configured(schedule)
        holders = schedule.data_holders
        shards = self._injected_shards(schedule, {h: [i] for i, h in enumerate(holders)}, peers)
        schedule.meta.update(start_iteration=start_iteration, num_shards=len(holders), shards=shards,
                             shard_positions={})
        validate(schedule)
        return schedule

    def _plan_options(self) -> PlanOptions:
        options = PlanOptions(microbatches_per_holder=self.config.microbatches, seed=self.config.seed,
                              collision_aware=self.config.planner != "skippipe-no-collision")
        if self.config.planner in BASELINE_METHODS:  # SkipPipe's paths are replaced: no polish
            options = replace(options, jitter_polish=0)
        return options

    def _as_configured(self, schedule: Schedule, counts: dict[int, int] | None = None) -> Schedule:
        """SkipPipe's schedule, or the configured baseline's on the same placement, work and costs."""
        method = BASELINE_METHODS.get(self.config.planner)
        if method is None:
            return schedule
        baseline = baseline_schedule(schedule, tables_from_dict(schedule.meta["costs"]), method,
                                     seed=self.config.seed, tune=True, microbatch_counts=counts)
        baseline.meta.update({k: v for k, v in schedule.meta.items() if k not in baseline.meta})
        return baseline

    def replan(self, peers: dict[str, PeerRecord], *, start_iteration: int,
               handing_over: Collection[str] = ()) -> Schedule:
        """A new epoch for the live `peers`: survivors keep their stages unless a move buys back what a departure
        cost, newcomers are placed one by one where they help most, and departed holders' shards go to the
        surviving holders with the fewest.

        :param handing_over: peers leaving gracefully: when one was the last of its stage, a peer of the largest
          other stage group moves there and takes the stage's state over from it (`meta["handover"]`)
        """
        cfg, old = self.config, self.schedule
        cost = self._model_cost(peers)
        view = self._view(peers)
        tables = CostTables.from_view(view, cost)
        rules = PathRules.from_skip_ratio(cfg.stages, cfg.skip)
        # the first placement is shared by every method (as in the paper); a full pipeline's runtime then places
        # joiners and movers where its own columns need them
        goal = PlacementGoal(rules=rules, microbatches_per_holder=cfg.microbatches,
                             stage_param_bytes=cost.stage_param_bytes, latency=view.latency, bandwidth=view.bandwidth,
                             columns=cfg.planner == "full-pipeline")
        ids = list(tables.ids)
        stage_of = np.array([old.placement.get(p, -1) for p in ids])
        before = self.in_force(start_iteration - 1) if start_iteration > 0 else None
        # joiners and movers whose stage is not in force yet (placed by an epoch that has not started) do not hold
        # it: they neither move again nor hand its state over
        unsettled = {i for i, p in enumerate(ids)
                     if before is None or stage_of[i] < 0 or before.placement.get(p) != stage_of[i]}
        # survivors take over the stages left by graceful leavers first: a joiner would only get neighbour blocks
        handover = self._hand_over(tables, stage_of, handing_over, unsettled)
        unsettled |= {ids.index(p) for p in handover}
        num_shards = int(old.meta.get("num_shards", len(old.data_holders)))
        for i, p in enumerate(ids):
            if stage_of[i] < 0:
                # a shard carried by a holder not its own
                wanted = len(shard_drawers([ids[j] for j in np.flatnonzero(stage_of == 0)], peers)) < num_shards
                stage_of = place_joining(tables, stage_of, i, goal, data_holder=peers[p].data_holder,
                                         holder_wanted=wanted)
                logger.info("placing joining peer %s on stage %d%s", p, stage_of[i],
                            " (a data shard lost its holder)" if wanted and stage_of[i] == 0 else "")
        if not np.any(stage_of == 0):
            raise RuntimeError("every data holder (stage 0) is gone: no microbatch can be injected until one joins")
        if cfg.rebalance:
            stage_of = self._rebalance(tables, goal, stage_of, peers, handover, unsettled)
        if cfg.planner == "full-pipeline":  # every microbatch visits every stage: an empty one is refilled
            was = stage_of.copy()
            stage_of, filled = place_after_departure(tables, stage_of, [], goal, fixed=unsettled)
            for v in filled:
                logger.warning("stage %d lost every peer and a full pipeline cannot skip it: %s moves there from "
                               "stage %d and restarts it", stage_of[v], ids[v], was[v])
        empty = {st for st in range(1, cfg.stages) if not np.any(stage_of == st)}
        if empty:
            asked = rules.stages_per_path
            rules, relaxed = rules_around(rules, empty)
            logger.warning("stage(s) %s lost every peer: paths skip them until a peer takes them over%s",
                           sorted(empty), f"; the skip budget is relaxed: paths visit {rules.stages_per_path} "
                           f"stages instead of {asked}" if relaxed else "")
        holders = [ids[i] for i in np.flatnonzero(stage_of == 0)]
        shards = self._assign_shards(holders, peers, num_shards)
        counts = {ids.index(h): cfg.microbatches * max(1, len(ks)) for h, ks in shards.items()}
        options = self._plan_options()
        options = replace(options, jitter_polish=min(options.jitter_polish, REPLAN_JITTER_POLISH))  # the swarm waits
        schedule = plan_tables(tables, rules, options, stage_of=stage_of, epoch=old.epoch + 1,
                               run_id=cfg.run_id, microbatch_counts=counts)
        schedule = self._as_configured(schedule, counts)
        shards = self._injected_shards(schedule, shards, peers)
        joiners = [p for p in schedule.placement if before is None or p not in before.placement]
        # a move not yet taken (this epoch replaces the one that made it, from the same iteration) stands
        earlier = old.meta.get("handover") or {}
        handover.update({p: src for p, src in earlier.items() if p in schedule.placement and before is not None
                         and p in before.placement and before.placement[p] != schedule.placement[p]})
        schedule.meta.update(start_iteration=start_iteration, num_shards=num_shards, shards=shards,
                             shard_positions=dict(self.shard_positions), joiners=joiners,
                             restore=self._restore_sources(schedule, before, handover), handover=handover)
        validate(schedule, balance_tolerance=None)
        return schedule

    def _rebalance(self, tables: CostTables, goal: PlacementGoal, stage_of: np.ndarray,
                   peers: dict[str, PeerRecord], handover: dict[str, str], unsettled: set[int]) -> np.ndarray:
        """Moves of survivors into the stage groups departures shrank, where they pay (`placement.rebalance`);
        each mover is added to `handover` with the peer of its new stage that sends it the stage's state."""
        old, ids = self.schedule, list(tables.ids)
        had = np.bincount(list(old.placement.values()), minlength=old.num_stages)
        has = np.bincount(stage_of[stage_of >= 0], minlength=old.num_stages)
        shrunk = {st for st in range(old.num_stages) if has[st] < had[st]}
        if not shrunk:
            return stage_of
        holders = [ids[i] for i in np.flatnonzero(stage_of == 0)]
        shards = self._assign_shards(holders, peers, int(old.meta.get("num_shards", len(old.data_holders))))
        counts = {ids.index(h): self.config.microbatches * max(1, len(ks)) for h, ks in shards.items()}
        own_data = {i for i in range(len(ids)) if peers[ids[i]].data_holder}  # they draw their own documents only
        out, _, moves = rebalance(tables, stage_of, shrunk, goal, counts=counts, fixed=own_data, unsettled=unsettled)
        for v, source in moves.items():
            logger.warning("stage %d's group shrank: %s moves there from stage %d and takes its state over from %s",
                           out[v], ids[v], stage_of[v], ids[source])
            handover[ids[v]] = ids[source]
        return out

    def _assign_shards(self, holders: list[str], peers: dict[str, PeerRecord], num_shards: int
                       ) -> dict[str, list[int]]:
        return assign_shards(self.schedule.meta.get("shards", {}), holders, shard_drawers(holders, peers), num_shards)

    def _injected_shards(self, schedule: Schedule, shards: dict[str, list[int]], peers: dict[str, PeerRecord]
                         ) -> dict[str, list[int]]:
        """`shards` with those of holders that inject nothing in `schedule` moved to holders that do, and every
        change from the previous epoch's assignment logged."""
        injecting = {r.origin for r in schedule.routes}
        out, _ = shards_to_injectors(shards, injecting, shard_drawers(shards, peers))
        before = self.schedule.meta.get("shards", {}) if self.schedule is not None else shards
        owner = {k: h for h, ks in before.items() for k in ks}
        for h, ks in out.items():
            for k in ks:
                was = owner.get(k)
                if was is None or was == h:
                    continue
                if was not in out:
                    logger.info("shard %d goes to %s (%s is no longer a data holder)", k, h, was)
                else:
                    logger.info("shard %d moves from %s to %s%s", k, was, h,
                                "" if was in injecting else f" ({was} injects no microbatch in this epoch)")
        return out

    def _hand_over(self, tables: CostTables, stage_of: np.ndarray, leaving: Collection[str],
                   unsettled: set[int]) -> dict[str, str]:
        """Moves for stages whose last peers leave gracefully (`stage_of` is updated): mover -> the leaving peer it
        takes the stage's state from.

        The mover comes from the largest group of another non-zero stage (it keeps at least one peer), the one
        with the fastest links to the peers of the stages next to the vacated one. No group with a spare peer: the
        stage is left empty (paths skip it until a joiner takes it over)."""
        old, ids, moves = self.schedule, list(tables.ids), {}
        for stage in sorted({old.placement[p] for p in leaving if p in old.placement} - {0}):
            if np.any(stage_of == stage):
                continue
            source = sorted(p for p in leaving if old.placement.get(p) == stage)[0]
            candidates = movers_to(tables, stage_of, stage, old.num_stages, unsettled, limit=1)
            if not candidates:
                logger.warning("%s, stage %d's last peer, leaves and no stage has a peer to spare: stage %d is left "
                               "empty", source, stage, stage)
                continue
            mover = candidates[0]
            logger.warning("%s, stage %d's last peer, leaves: %s moves from stage %d to take it over", source, stage,
                           ids[mover], stage_of[mover])
            stage_of[mover] = stage
            moves[ids[mover]] = source
        return moves

    @staticmethod
    def _restore_sources(schedule: Schedule, before: Schedule | None, handover: dict[str, str]) -> dict[str, str]:
        """Peer new to its stage (a joiner, or a mover with no stage peer to take the state from) -> the peer it
        starts the stage from, for stages nobody kept serving: a veteran of the nearest stage below (above if
        none); a joiner uses its own checkpoint of the stage instead if it has one."""
        if before is None:
            return {}
        fresh = [p for p, st in schedule.placement.items() if before.placement.get(p) != st and p not in handover]
        veterans = {p: st for p, st in schedule.placement.items() if before.placement.get(p) == st}
        sources = {}
        for p in fresh:
            st = schedule.placement[p]
            if st == 0 or st in veterans.values():
                continue
            nearest = sorted((abs(vs - st), vs > st, vs == 0, q) for q, vs in veterans.items())
            if nearest:
                sources[p] = nearest[0][3]
        return sources

    def _follow_membership(self, peers: dict[str, PeerRecord]) -> None:
        """Re-plan when a scheduled peer is gone or a new one has settled.

        The new epoch starts at the next iteration: the one in progress goes on, its forwards detoured around the
        gone peers (peers are told who is gone), unless a data holder is among them (its microbatches cannot
        finish) or a holder cannot re-queue a broken microbatch: then the iteration is run again under the new epoch.
        """
        now = time.monotonic()
        for p in peers:
            self._first_seen.setdefault(p, now)
        gone = [p for p in self.schedule.placement if p not in peers]
        draining = [p for p in self.schedule.placement if p in peers and peers[p].state == PeerState.DRAINING]
        # a joiner announces itself before it has probed its links: placed earlier, the others would wait for it
        joining = [p for p, r in peers.items() if p not in self.schedule.placement and r.state == PeerState.JOINING
                   and now - self._first_seen[p] >= SETTLE_SECONDS
                   and (r.links or now - self._first_seen[p] >= JOIN_PROBE_SECONDS)]
        if not gone and not joining and not draining:
            return
        if gone:
            self._publish(membership_topic(self.config.run_id), {"event": "gone", "peers": gone,
                                                                 "iteration": self.completed})
        # a holder's draws of the iteration in progress are ledgered against the positions of the last commit:
        # without it, or when a joiner is to take over a shard another holder carries, that iteration runs again
        # (a draining holder is not announced gone: nothing is detoured)
        in_force = self.in_force(self.completed)
        holders = set(in_force.data_holders)
        staying = len(shard_drawers(holders - {*gone, *draining}, peers))
        shard_moves = bool(shard_drawers(joining, peers)) and \
            staying < int(in_force.meta.get("num_shards", len(holders)))
        start = self.completed if holders & {*gone, *draining} or shard_moves else self.completed + 1
        logger.warning("membership changed (gone: %s, leaving: %s, joining: %s): re-planning from iteration %d",
                       gone, draining, joining, start)
        live = {p: r for p, r in peers.items()
                if (p in self.schedule.placement or p in joining) and p not in draining}
        try:
            self.publish_schedule(self.replan(live, start_iteration=start, handing_over=draining))
        except (RuntimeError, ValueError) as e:
            logger.error("could not re-plan: %s", e)

    def _view(self, peers: dict[str, PeerRecord]) -> SwarmView:
        cfg = self.config
        if cfg.profile:
            preset = swarm_from(cfg.profile, len(peers), seed=cfg.seed, memory=cfg.memory)
            return SwarmView([PeerSpec(id=p, seconds_per_layer=s.seconds_per_layer, memory_slots=cfg.memory,
                                       region=s.region, data_holder=peers[p].data_holder)
                              for p, s in zip(sorted(peers), preset.peers)],
                             preset.latency, preset.bandwidth, preset.message_overhead)
        return view_from_records(peers)

    def publish_schedule(self, schedule: Schedule) -> None:
        if not self.records.publish_schedule(ScheduleMsg.from_schedule(schedule)):
            raise RuntimeError(f"could not store schedule epoch {schedule.epoch} in the DHT")
        self.schedule = schedule
        self.schedules.append(schedule)
        if self.run_dir:
            (self.run_dir / f"schedule-{schedule.epoch}.json").write_text(schedule.to_json())
        paths = len({(r.origin, r.stages, r.peers) for r in schedule.routes})
        logger.info("schedule epoch %d from iteration %d: %d peers, %d microbatches on %d distinct paths, predicted "
                    "%.3f s/iteration, planned in %.2f s", schedule.epoch, schedule.meta["start_iteration"],
                    len(schedule.placement), len(schedule.routes), paths,
                    schedule.predicted_iteration_seconds or float("nan"), schedule.meta.get("plan_seconds", 0.0))
        self._publish(schedule_topic(self.config.run_id), {"epoch": schedule.epoch})

    # ---- progress ---------------------------------------------------------------------------------
    def _drain_gossip(self, timeout: float) -> None:
        try:
            msg = self._gossip_inbox.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self._gossip_inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, msg: GossipMessage) -> None:
        if msg.topic == membership_topic(self.config.run_id):
            logger.info("membership: %s %s", msg.payload.get("event"), msg.payload.get("peer", msg.sender))
            event = msg.payload.get("event")
            if event == "stuck" or (event == "broken" and msg.payload.get("rerun") is True):
                self._restart_iteration(msg)
            elif event == "broken":
                self._note_broken(msg)
            elif event == "unreachable":
                self._note_unreachable(msg)
            return
        if msg.topic != progress_topic(self.config.run_id) or self.schedule is None:
            return
        p = msg.payload
        if p.get("kind") != "done":
            return
        if not any(msg.sender in sch.data_holders for sch in self.schedules):
            logger.warning("ignored a progress report from %s: not a data holder of the schedule", msg.sender)
            return
        try:
            it, epoch = int(p["iteration"]), int(p["epoch"])
            report = {k: float(p[k]) for k in ("loss_sum", "losses", "tokens", "started", "finished")}
            shards = dict(p.get("shards", {}))
        except (KeyError, TypeError, ValueError):
            logger.warning("ignored a malformed progress report from %s", msg.sender)
            return
        report["shards"] = shards
        self._reports.setdefault((it, epoch), {})[msg.sender] = report
        self._try_commit()

    def _note_broken(self, msg: GossipMessage) -> None:
        """A microbatch of the iteration in progress broke at a scheduled peer (its holder re-queues it): the peer
        it names, if the same reporter found it unreachable, is taken for gone now, so that the next epoch and the
        other peers' detours leave it out."""
        suspect = msg.payload.get("gone")
        if self.schedule is None or msg.sender not in self.schedule.placement or not isinstance(suspect, str) or \
                suspect not in self.schedule.placement or suspect in self._declared_gone or \
                msg.payload.get("iteration") != self.completed:
            return
        if msg.sender in self._unreachable.reporters(suspect, time.monotonic()):  # it could not reach it either
            self._declare_gone(suspect, "reported unreachable while a microbatch broke")

    def _restart_iteration(self, msg: GossipMessage) -> None:
        """A scheduled peer reports the iteration in progress unable to finish: stuck past its deadline (a message
        was lost), or a microbatch its holder could not re-queue (no detour, or too many attempts broke). Run the
        iteration again under a new epoch on the live peers of the newest one, once per iteration and epoch."""
        p = msg.payload
        it, epoch = p.get("iteration"), p.get("epoch")
        if self.schedule is None or it != self.completed:
            return
        running = self.in_force(self.completed)
        if msg.sender not in running.placement or epoch != running.epoch or (it, epoch) in self._restarted:
            return
        self._restarted.add((it, epoch))
        if p.get("event") == "broken":  # a peer that held activations died: whoever is reported unreachable is
            now = time.monotonic()      # taken for gone now, or the rerun would wait on it again
            for suspect in [q for q in self.schedule.placement if self._unreachable.reporters(q, now)]:
                self._declare_gone(suspect, "reported unreachable while a microbatch broke")
        peers = {q: r for q, r in self._live_peers().items() if q in self.schedule.placement}
        logger.warning("iteration %d is %s at %s under epoch %d: running it again under a new epoch", it,
                       p.get("event"), msg.sender, epoch)
        try:
            self.publish_schedule(self.replan(peers, start_iteration=self.completed))
        except (RuntimeError, ValueError) as e:
            logger.error("could not re-plan: %s", e)

    def _publish(self, topic: str, payload: dict[str, Any]) -> None:
        """Gossip `payload`; a scheduler living in a peer also hands it to that peer (gossip skips the sender)."""
        self._gossip.publish(topic, payload)
        if self._local is not None:
            self._local(GossipMessage(topic=topic, sender=self.peer_id, seqno=0, payload=payload))

    def in_force(self, iteration: int) -> Schedule:
        """The epoch that runs `iteration`: the newest one starting at or before it (a successor that knows only
        later epochs takes its oldest)."""
        started = [s for s in self.schedules if s.meta["start_iteration"] <= iteration]
        return max(started, key=lambda s: s.epoch) if started else self.schedules[0]

    def _try_commit(self) -> None:
        """Commit the iteration in progress once every holder of its epoch has reported it done."""
        schedule = self.in_force(self.completed)
        key = (self.completed, schedule.epoch)
        reports = self._reports.get(key, {})
        if not set(schedule.data_holders) <= set(reports):
            return
        for r in reports.values():
            self.shard_positions.update(r["shards"])
        # a shard that changes holder at the next iteration starts where this commit leaves it
        self._publish(progress_topic(self.config.run_id),
                      {"kind": "commit", "iteration": self.completed, "epoch": schedule.epoch,
                       "shards": dict(self.shard_positions)})
        self._emit(self.completed, reports)
        self._reports = {k: v for k, v in self._reports.items() if k[0] > key[0]}

    def _emit(self, iteration: int, reports: dict[str, dict[str, float]]) -> None:
        losses = sum(r["losses"] for r in reports.values())
        seconds = max(r["finished"] for r in reports.values()) - min(r["started"] for r in reports.values())
        tokens = sum(r["tokens"] for r in reports.values())
        record = {
            "iteration": iteration + 1,
            "loss": round(sum(r["loss_sum"] for r in reports.values()) / max(1.0, losses), 6),
            "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
            "iteration_seconds": round(seconds, 4),
            "peers_online": self.peers_online,
            "epoch": self.in_force(iteration).epoch,
            "time": round(time.time(), 3),
        }
        jitter = pooled_jitter([d for p in self.in_force(iteration).placement if p in self._records
                                for d in self._records[p].jitter])
        if jitter is not None:  # the scheduled peers' latest measurements, pooled as the planner pools them
            record["jitter_ms"] = [round(1e3 * q, 2) for q in jitter_quantiles(jitter)]
        self.completed = max(self.completed, iteration + 1)
        logger.info("iteration %(iteration)d  loss %(loss).4f  %(tokens_per_s)s tokens/s  %(iteration_seconds).3f s  "
                    "%(peers_online)d peers  epoch %(epoch)d", record)
        if self.metrics_path:
            with self.metrics_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
