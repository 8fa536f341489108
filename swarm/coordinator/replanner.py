"""`Replanner`: the scheduler's plans, first and after every membership change, from the peers' records.

The first plan places the peers and plans every microbatch's path (or takes a saved plan of the same peers). A
re-plan keeps survivors on their stages, places joiners one by one where they help most, hands a stage whose last
peer leaves gracefully to a peer of another group, moves a survivor into a group a departure shrank when that
pays (`swarm.rebalance`), refills an emptied stage for a full pipeline, and hands departed holders' shards to the
holders that inject. Every schedule carries in its `meta` what the peers need to follow it: where it starts, the
shards and their positions, joiners, and who equips a moved or restarted peer. No I/O here: the caller publishes.

The SWARM-style baseline (`swarm.planner = "swarm"`) plans its own way: its own placement (balanced by throughput,
tuned on its simulated wiring), joiners sent to the bottleneck stage, at each re-plan one peer moved from the
least-loaded stage to the bottleneck where that does not lengthen the simulated iteration (an emptied stage refilled
first), and a fresh draw of its stochastic wiring, which the peers then follow for the whole epoch.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from peers.model import ModelConfig
from peers.stage import balanced_split, stage_template
from scheduler.constants import LOSS_FACTOR
from scheduler.costs import CostTables, tables_from_dict
from scheduler.path_rules import PathRules, rules_around
from scheduler.placement import (
    PlacementGoal,
    movers_to,
    place_after_departure,
    place_joining,
    rebalance,
    stage_sizes,
)
from scheduler.planner import (
    REPLAN_JITTER_POLISH,
    PlanOptions,
    baseline_schedule,
    plan,
    plan_swarm,
    plan_tables,
    swarm_schedule,
)
from scheduler.profiles import swarm_from
from scheduler.schedule import Schedule, validate
from scheduler.swarm_balance import join_stage, rebalance_once
from scheduler.swarm_tuning import move_pays
from scheduler.swarm_view import ModelCost, PeerSpec, SwarmView
from swarm.coordinator.epochs import EpochHistory
from swarm.coordinator.holder_shares import holder_microbatches
from swarm.coordinator.reckoning import carried_moves, epoch_joiners, restore_sources
from swarm.coordinator.shard_assignment import assign_shards, shard_drawers, shards_to_injectors
from swarm.events import event
from swarm.net.link_probe import link_matrices
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)


class NoDataHolder(RuntimeError):
    """Every data holder (stage 0) is gone: no epoch can be planned until one joins or comes back."""


BASELINE_METHODS = {"full-pipeline": "full_pipeline", "random-skip": "random_skip"}
"""`swarm.planner` baselines -> `baseline_schedule`'s method, which their schedules carry as `planner`."""


def saved_plan_mismatch(schedule: Schedule, config: RunConfig) -> str | None:
    """Why a saved plan cannot start a run of `config` (None if it can)."""
    planner = BASELINE_METHODS.get(config.planner) or \
        (config.planner if config.planner in ("skippipe", "swarm") else "skippipe_without_collision_awareness")
    if schedule.num_stages != config.stages:
        return f"it has {schedule.num_stages} stages, the run {config.stages}"
    if schedule.planner != planner:
        return f"it was made by the {schedule.planner!r} planner, the run plans with {config.planner!r}"
    return None


def view_from_records(records: Mapping[str, PeerRecord]) -> SwarmView:
    """The scheduler's view of the swarm from the peers' own (signed, measured) records."""
    order = sorted(records)
    peers = [PeerSpec(id=p, seconds_per_layer=records[p].seconds_per_layer, memory_slots=records[p].memory_slots,
                      data_holder=records[p].data_holder, loss_seconds=records[p].loss_seconds,
                      message_jitter=records[p].jitter) for p in order]
    lat, bw = link_matrices(records, order, default_latency=0.001, default_bandwidth=1e9)
    # measured latency already includes the per-message cost of the transport
    return SwarmView(peers=peers, latency=lat, bandwidth=bw, message_overhead=0.0)


def first_pin(record: PeerRecord, history: EpochHistory, stages: int) -> int | None:
    """The stage a joiner asks to serve (`--stage`), honoured on its first placement in the run: a peer placed
    before announces the stage it last served, which may be one it gave up (its state did not come). Not stage 0:
    mid-run, a peer without data of its own goes there only to draw a shard that lost its holder (there is no other
    shard to give it), and one with data goes there anyway."""
    if record.data_holder or not 1 <= record.stage < stages or last_stage(history, record.peer_id) is not None:
        return None
    return record.stage


def last_stage(history: EpochHistory, peer: str) -> int | None:
    """The stage of the newest epoch that placed `peer` (None if none did)."""
    return next((s.placement[peer] for s in reversed(history.all) if peer in s.placement), None)


def hand_over(old: Schedule, tables: CostTables, stage_of: np.ndarray, leaving: Collection[str],
              unsettled: set[int]) -> dict[str, str]:
    """Moves for stages whose last peers leave gracefully (`stage_of` is updated): mover -> the leaving peer it
    takes the stage's state from.

    The mover comes from the largest group of another non-zero stage (it keeps at least one peer), the one
    with the fastest links to the peers of the stages next to the vacated one. No group with a spare peer: the
    stage is left empty (paths skip it until a joiner takes it over)."""
    ids, moves = list(tables.ids), {}
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
                       ids[mover], stage_of[mover],
                       extra=event("peer_moved", peer=ids[mover], from_stage=int(stage_of[mover]), to_stage=int(stage),
                                   source=source, why="handover"))
        stage_of[mover] = stage
        moves[ids[mover]] = source
    return moves


class Replanner:
    """Plans for one run. Holds only what does not change between plans (the run's config and model).

    :param config: the run's configuration (stages, skip, planner, microbatches, rebalancing)
    :param model: the run spec's model dictionary (`ModelConfig` fields)
    """

    def __init__(self, config: RunConfig, model: Mapping[str, Any]) -> None:
        self.config = config
        self.model = dict(model)
        self._param_bytes: tuple[int, ...] | None = None

    # ---- costs ------------------------------------------------------------------------------------
    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """The model's layers on each stage."""
        return tuple(balanced_split(self.model["n_layers"], self.config.stages))

    def model_cost(self, peers: Mapping[str, PeerRecord]) -> ModelCost:
        """The model's costs: layers per stage, bytes per message, and the loss step relative to the stage-0
        forward as the peers measured it (it depends on the vocabulary, which a decoder block does not show)."""
        cfg, model = self.config, self.model
        layers = self.layers_per_stage
        activation = cfg.message_size(model["dim"])  # as the peers send it: padded where emulation says so
        ratios = [r.loss_seconds / (r.seconds_per_layer * max(1, layers[0])) for r in peers.values()
                  if r.loss_seconds > 0]
        loss_factor = statistics.median(ratios) if ratios else LOSS_FACTOR
        if self._param_bytes is None:  # what each stage group averages (float32 gradients), for placement
            config = ModelConfig.from_dict(model)
            self._param_bytes = tuple(4 * sum(shape.numel() for shape in stage_template(config, layers, s).values())
                                      for s in range(cfg.stages))
        return ModelCost(layers_per_stage=tuple(layers), activation_bytes=activation, loss_factor=loss_factor,
                         stage_param_bytes=self._param_bytes)

    def tables(self, peers: Mapping[str, PeerRecord]) -> CostTables:
        """The cost tables a plan of `peers` would take (their records as they are)."""
        return CostTables.from_view(self.view(peers), self.model_cost(peers))

    def view(self, peers: Mapping[str, PeerRecord]) -> SwarmView:
        """The measured view of `peers`, or the configured profile's on their ids."""
        cfg = self.config
        if cfg.profile:
            preset = swarm_from(cfg.profile, len(peers), seed=cfg.seed, memory=cfg.memory)
            return SwarmView([PeerSpec(id=p, seconds_per_layer=s.seconds_per_layer, memory_slots=cfg.memory,
                                       region=s.region, data_holder=peers[p].data_holder)
                              for p, s in zip(sorted(peers), preset.peers)],
                             preset.latency, preset.bandwidth, preset.message_overhead)
        return view_from_records(peers)

    # ---- the first plan ---------------------------------------------------------------------------
    def plan(self, peers: Mapping[str, PeerRecord], *, epoch: int, start_iteration: int) -> Schedule:
        """Place `peers` and plan their paths (on the measured view, or on the configured profile)."""
        cfg = self.config
        rules = PathRules.from_skip_ratio(cfg.stages, cfg.skip)
        pinned = {p: r.stage for p, r in peers.items() if r.stage >= 0}
        counts, first_shards = None, None
        if cfg.planner == "full-pipeline":
            schedule, counts, first_shards = self._full_pipeline_placement(peers, pinned, epoch)
        elif cfg.planner == "swarm":  # its own placement (balanced by throughput, tuned) and wiring
            schedule = plan_swarm(self.view(peers), self.model_cost(peers), rules, self._plan_options(), epoch=epoch,
                                  run_id=cfg.run_id, placement=pinned or None)
        else:
            schedule = plan(self.view(peers), self.model_cost(peers), rules, self._plan_options(), epoch=epoch,
                            run_id=cfg.run_id, placement=pinned or None)
        schedule = self._as_configured(schedule, counts)
        holders = schedule.data_holders
        shards = self._injected_shards(schedule, first_shards or {h: [i] for i, h in enumerate(holders)}, peers,
                                       None)
        schedule.meta.update(start_iteration=start_iteration, num_shards=sum(map(len, shards.values())),
                             shards=shards,
                             shard_positions={})
        validate(schedule)
        return schedule

    def from_saved(self, saved: Schedule, peers: Mapping[str, PeerRecord]) -> Schedule:
        """A saved plan of these peers as the run's epoch 0 (peers that are not in it join through a re-plan)."""
        holders = saved.data_holders
        shards = self._injected_shards(saved, {h: [i] for i, h in enumerate(holders)}, peers, None)
        schedule = replace(saved, epoch=0, run_id=self.config.run_id,
                           meta={**saved.meta, "start_iteration": 0, "num_shards": len(holders),
                                 "shards": shards, "shard_positions": {},
                                 "saved_plan": True, "plan_seconds": 0.0})
        validate(schedule)
        logger.info("starting from the saved plan (%d peers, planned by %s)", len(schedule.placement),
                    schedule.planner)
        return schedule

    def _full_pipeline_placement(self, peers: Mapping[str, PeerRecord], pinned: Mapping[str, int], epoch: int
                                 ) -> tuple[Schedule, dict[int, int], dict[str, list[int]]]:
        """A full pipeline's own first placement: stage groups sized for paths through every stage (as many
        columns as the peers allow), searched on the simulated iteration of its own columns, not on SkipPipe's
        skip paths (a fair baseline: on 12 peers SkipPipe's groups 3, 2, 2, 2, 2, 1 leave it one column).

        Its data holders carry the data shards SkipPipe's placement of these peers would have (one per holder of
        that placement, dealt round-robin), `run.microbatches` per shard, so both train the same tokens per
        iteration, in re-plans too.

        :returns: the schedule, the microbatches each of its holders injects (peer index -> count), its shards
        """
        cfg = self.config
        view, cost = self.view(peers), self.model_cost(peers)
        tables = CostTables.from_view(view, cost)
        rules = PathRules(cfg.stages, cfg.stages, max_swaps=0)
        goal = PlacementGoal(rules=rules, microbatches_per_holder=cfg.microbatches,
                             stage_param_bytes=cost.stage_param_bytes, latency=view.latency,
                             bandwidth=view.bandwidth, columns=True)
        fixed = {i: 0 for i, p in enumerate(view.peers) if p.data_holder}
        fixed.update({view.index(p): st for p, st in pinned.items()})
        holders = sum(1 for st in fixed.values() if st == 0) or None
        num_shards = stage_sizes(len(view.peers), PathRules.from_skip_ratio(cfg.stages, cfg.skip), holders)[0]
        options = replace(self._plan_options(), iterations=0)  # its paths are the columns `_as_configured` tunes
        stage_of = np.array([fixed[i] for i in range(len(view.peers))]) if len(fixed) == len(view.peers) else None
        schedule = plan_tables(tables, rules, options, stage_of=stage_of, pinned=fixed, goal=goal, epoch=epoch,
                               run_id=cfg.run_id)
        mine = schedule.data_holders
        shards = {h: list(range(k, max(num_shards, len(mine)), len(mine))) for k, h in enumerate(mine)}
        counts = {tables.ids.index(h): cfg.microbatches * len(ks) for h, ks in shards.items()}
        return schedule, counts, shards

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

    # ---- re-plans ---------------------------------------------------------------------------------
    def replan(self, peers: Mapping[str, PeerRecord], history: EpochHistory, *, start_iteration: int,
               shard_positions: Mapping[str, Any], handing_over: Collection[str] = (),
               stateless: Collection[str] = (), shares: Mapping[str, float] | None = None) -> Schedule:
        """A new epoch for the live `peers`: survivors keep their stages unless a move buys back what a departure
        cost, newcomers are placed one by one where they help most (a newcomer that asks for a stage, there), and
        departed holders' shards go to the surviving holders with the fewest. A peer that left and joined again
        (`stateless`) is placed on another stage than the one it last served where it can be: it may have left
        because that stage's veterans withheld their state.

        :param history: the epochs published so far (the new one follows the latest)
        :param start_iteration: the first iteration the new epoch runs
        :param shard_positions: each shard's position after the last committed iteration
        :param handing_over: peers leaving gracefully: when one was the last of its stage, a peer of the largest
          other stage group moves there and takes the stage's state over from it (`meta["handover"]`)
        :param stateless: peers that hold no stage's state whatever the epochs say (they left and joined again: a
          restarted process, or a joiner whose stage's state did not come): joiners wherever they are placed, and
          not on their last stage if another one will do
        :param shares: holder -> the share of its microbatches it is given, where less than all of them (a holder the
          commits showed slower than the others: `HolderShares`)
        """
        cfg, old = self.config, history.latest
        cost = self.model_cost(peers)
        view = self.view(peers)
        tables = CostTables.from_view(view, cost)
        rules = PathRules.from_skip_ratio(cfg.stages, cfg.skip)
        # the first placement is shared by every method (as in the paper); a full pipeline's runtime then places
        # joiners and movers where its own columns need them
        goal = PlacementGoal(rules=rules, microbatches_per_holder=cfg.microbatches,
                             stage_param_bytes=cost.stage_param_bytes, latency=view.latency, bandwidth=view.bandwidth,
                             columns=cfg.planner == "full-pipeline")
        ids = list(tables.ids)
        stage_of = np.array([old.placement.get(p, -1) for p in ids])
        before = history.in_force(start_iteration - 1) if start_iteration > 0 else None
        # joiners and movers whose stage is not in force yet (placed by an epoch that has not started) do not hold
        # it: they neither move again nor hand its state over
        unsettled = {i for i, p in enumerate(ids)
                     if before is None or stage_of[i] < 0 or before.placement.get(p) != stage_of[i]}
        # survivors take over the stages left by graceful leavers first: a joiner would only get neighbour blocks
        handover = hand_over(old, tables, stage_of, handing_over, unsettled)
        unsettled |= {ids.index(p) for p in handover}
        num_shards = int(old.meta.get("num_shards", len(old.data_holders)))
        for i, p in enumerate(ids):
            if stage_of[i] < 0:
                # a shard carried by a holder not its own
                wanted = len(shard_drawers([ids[j] for j in np.flatnonzero(stage_of == 0)], peers)) < num_shards
                pin = first_pin(peers[p], history, cfg.stages)
                given_up = last_stage(history, p) if p in stateless else None
                if pin is not None:
                    stage_of[i] = pin
                elif cfg.planner == "swarm":  # SWARM: a joiner serves the bottleneck stage
                    stage_of[i] = 0 if peers[p].data_holder or wanted else \
                        join_stage(tables, stage_of, cfg.stages, avoid=() if given_up is None else (given_up,))
                else:
                    stage_of = place_joining(tables, stage_of, i, goal, data_holder=peers[p].data_holder,
                                             holder_wanted=wanted, avoid=() if given_up is None else (given_up,))
                logger.info("placing joining peer %s on stage %d%s", p, stage_of[i],
                            " (a data shard lost its holder)" if wanted and stage_of[i] == 0 else "",
                            extra=event("joiner_placed", peer=p, stage=int(stage_of[i])))
        if not np.any(stage_of == 0):
            raise NoDataHolder("every data holder (stage 0) is gone: no microbatch can be injected until one joins")
        if cfg.planner == "swarm":
            stage_of = self._swarm_rebalance(tables, stage_of, peers, handover, unsettled)
        elif cfg.rebalance:
            stage_of = self._rebalance(old, tables, goal, stage_of, peers, handover, unsettled, shares)
        if cfg.planner == "full-pipeline":  # every microbatch visits every stage: an empty one is refilled
            was = stage_of.copy()
            stage_of, filled = place_after_departure(tables, stage_of, [], goal, fixed=unsettled)
            for v in filled:
                logger.warning("stage %d lost every peer and a full pipeline cannot skip it: %s moves there from "
                               "stage %d and restarts it", stage_of[v], ids[v], was[v],
                               extra=event("peer_moved", peer=ids[v], from_stage=int(was[v]),
                                           to_stage=int(stage_of[v]), why="refill"))
        empty = {st for st in range(1, cfg.stages) if not np.any(stage_of == st)}
        if empty:
            asked = rules.stages_per_path
            rules, relaxed = rules_around(rules, empty)
            logger.warning("stage(s) %s lost every peer: paths skip them until a peer takes them over%s",
                           sorted(empty), f"; the skip budget is relaxed: paths visit {rules.stages_per_path} "
                           f"stages instead of {asked}" if relaxed else "",
                           extra=event("stage_emptied", stages=sorted(int(st) for st in empty)))
        holders = [ids[i] for i in np.flatnonzero(stage_of == 0)]
        shards = assign_shards(old.meta.get("shards", {}), holders, shard_drawers(holders, peers), num_shards)
        counts = self._counts(ids, shards, shares)
        options = self._plan_options()
        options = replace(options, jitter_polish=min(options.jitter_polish, REPLAN_JITTER_POLISH))  # the swarm waits
        if cfg.planner == "swarm":  # a fresh draw of the wiring on the new placement
            schedule = swarm_schedule(tables, stage_of, cfg.stages, microbatches_per_holder=cfg.microbatches,
                                      microbatch_counts=counts, seed=cfg.seed, epoch=old.epoch + 1, run_id=cfg.run_id)
        else:
            schedule = plan_tables(tables, rules, options, stage_of=stage_of, epoch=old.epoch + 1,
                                   run_id=cfg.run_id, microbatch_counts=counts)
            schedule = self._as_configured(schedule, counts)
        shards = self._injected_shards(schedule, shards, peers, old)
        # a move not yet taken (this epoch replaces the one that made it, from the same iteration) stands
        handover.update(carried_moves(schedule, old, before))
        joiners = epoch_joiners(schedule, before, peers, stateless, handover)
        schedule.meta.update(start_iteration=start_iteration, num_shards=num_shards, shards=shards,
                             shard_positions=dict(shard_positions), joiners=joiners,
                             restore=restore_sources(schedule, before, joiners), handover=handover)
        validate(schedule, balance_tolerance=None)
        return schedule

    def _counts(self, ids: list[str], shards: Mapping[str, Collection[int]],
                shares: Mapping[str, float] | None) -> dict[int, int]:
        """Peer index -> microbatches each holder of `shards` injects: `run.microbatches` per shard, scaled by its
        share where it is given less (`holder_microbatches`)."""
        shares = shares or {}
        return {ids.index(h): holder_microbatches(self.config.microbatches, len(ks), shares.get(h, 1.0))
                for h, ks in shards.items()}

    def _rebalance(self, old: Schedule, tables: CostTables, goal: PlacementGoal, stage_of: np.ndarray,
                   peers: Mapping[str, PeerRecord], handover: dict[str, str], unsettled: set[int],
                   shares: Mapping[str, float] | None = None) -> np.ndarray:
        """Moves of survivors into the stage groups departures shrank, where they pay (`placement.rebalance`);
        each mover is added to `handover` with the peer of its new stage that sends it the stage's state."""
        ids = list(tables.ids)
        had = np.bincount(list(old.placement.values()), minlength=old.num_stages)
        has = np.bincount(stage_of[stage_of >= 0], minlength=old.num_stages)
        shrunk = {st for st in range(old.num_stages) if has[st] < had[st]}
        if not shrunk:
            return stage_of
        holders = [ids[i] for i in np.flatnonzero(stage_of == 0)]
        shards = assign_shards(old.meta.get("shards", {}), holders, shard_drawers(holders, peers),
                               int(old.meta.get("num_shards", len(old.data_holders))))
        counts = self._counts(ids, shards, shares)
        own_data = {i for i in range(len(ids)) if peers[ids[i]].data_holder}  # they draw their own documents only
        out, _, moves = rebalance(tables, stage_of, shrunk, goal, counts=counts, fixed=own_data, unsettled=unsettled)
        for v, source in moves.items():
            logger.warning("stage %d's group shrank: %s moves there from stage %d and takes its state over from %s",
                           out[v], ids[v], stage_of[v], ids[source],
                           extra=event("peer_moved", peer=ids[v], from_stage=int(stage_of[v]), to_stage=int(out[v]),
                                       source=ids[source], why="rebalance"))
            handover[ids[v]] = ids[source]
        return out

    def _swarm_rebalance(self, tables: CostTables, stage_of: np.ndarray, peers: Mapping[str, PeerRecord],
                         handover: dict[str, str], unsettled: set[int]) -> np.ndarray:
        """SWARM's rebalancing at a re-plan (`swarm_balance.rebalance_once`): a stage left without peers is refilled
        from the least-loaded stage first (every microbatch visits every stage), then, with `swarm.rebalance`, one
        peer moves from the least-loaded stage to the bottleneck if that raises the slowest stage's throughput and
        does not lengthen the simulated iteration of the wiring (`swarm_tuning.move_pays`: throughput is blind to
        which peers are near which, and the placement was tuned on the simulation). Data
        holders, peers with their own data and unsettled peers stay. Each mover is added to `handover` with the peer
        of its new stage that sends it the stage's state (none for an emptied stage: it restarts from a neighbour)."""
        ids, stages = list(tables.ids), self.config.stages
        fixed = set(unsettled) | {i for i in range(len(ids)) if peers[ids[i]].data_holder or stage_of[i] == 0}
        steps = 0
        while True:
            emptied = any(not np.any(stage_of == st) for st in range(1, stages))
            if not emptied and (steps or not self.config.rebalance):
                return stage_of
            out, move = rebalance_once(tables, stage_of, stages, fixed=fixed)
            if move is None:
                return stage_of
            holders = {int(h): self.config.microbatches for h in np.flatnonzero(stage_of == 0)}
            if not emptied and not move_pays(tables, stage_of, out, holders, seed=self.config.seed):
                logger.info("SWARM rebalancing: moving %s from stage %d to stage %d would raise the slowest stage's "
                            "throughput but lengthen the simulated iteration: no move", ids[move[0]], move[1], move[2])
                return stage_of
            v, was, to = move
            keepers = [int(m) for m in np.flatnonzero(stage_of == to) if int(m) not in unsettled]
            why = "refill" if not keepers else "rebalance"
            if keepers:
                source = min(keepers, key=lambda m: (float(tables.message[m, v]), m))
                handover[ids[v]] = ids[source]
            logger.warning("SWARM rebalancing: %s moves from stage %d, the least loaded, to stage %d, the bottleneck",
                           ids[v], was, to,
                           extra=event("peer_moved", peer=ids[v], from_stage=int(was), to_stage=int(to),
                                       why=why, **({"source": handover[ids[v]]} if keepers else {})))
            stage_of, steps = out, steps + 1
            fixed.add(v)

    @staticmethod
    def _injected_shards(schedule: Schedule, shards: dict[str, list[int]], peers: Mapping[str, PeerRecord],
                         previous: Schedule | None) -> dict[str, list[int]]:
        """`shards` with those of holders that inject nothing in `schedule` moved to holders that do, and every
        change from the `previous` epoch's assignment logged."""
        injecting = {r.origin for r in schedule.routes}
        out, _ = shards_to_injectors(shards, injecting, shard_drawers(shards, peers))
        before = previous.meta.get("shards", {}) if previous is not None else shards
        owner = {k: h for h, ks in before.items() for k in ks}
        for h, ks in out.items():
            for k in ks:
                was = owner.get(k)
                if was is None or was == h:
                    continue
                moved = event("shard_moved", shard=int(k), source=was, to=h)
                if was not in out:
                    logger.info("shard %d goes to %s (%s is no longer a data holder)", k, h, was, extra=moved)
                else:
                    logger.info("shard %d moves from %s to %s%s", k, was, h,
                                "" if was in injecting else f" ({was} injects no microbatch in this epoch)",
                                extra=moved)
        return out
