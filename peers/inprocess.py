"""`InProcessSwarm`: executes a scheduler `Schedule` end to end in one process.

One `StageWorker` per peer of the placement, each data holder with its own data shard. An
iteration injects every route's microbatch at its origin, runs the forward along the route's peers,
the loss back at the origin, the backward along the reversed route, then averages each stage
group's gradients weighted by visits and steps every worker once. The networked runtime calls the
same worker methods over the wire; this is the reference it is checked against, and a one-machine
study of skipping on its own.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

from peers.averaging import average_stage
from peers.data import Corpus, Shard
from peers.model import ModelConfig, Transformer
from peers.optim import OptimConfig
from peers.stage import balanced_split, check_split
from peers.worker import Precision, StageWorker, StepStats
from scheduler.constants import DEFAULT_MEMORY_SLOTS
from scheduler.path_rules import PathRules, valid_stage_sequences
from scheduler.schedule import Route, Schedule, validate

logger = logging.getLogger(__name__)

Order = Literal["sequential", "interleaved"]


@dataclass(frozen=True)
class IterationStats:
    iteration: int
    """Iterations completed, this one included."""
    loss: float
    """Mean training loss over the iteration's microbatches."""
    tokens: int
    seconds: float
    stage_visits: dict[int, int] = field(default_factory=dict)
    steps: dict[str, StepStats] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


class InProcessSwarm:
    """Every peer of a schedule as a worker in this process.

    :param corpus: the data; each data holder (sorted by id) gets shard i of D. Optional when every
      iteration is given its microbatches explicitly.
    :param split: decoder layers per stage; balanced by default
    :param recompute, loss_scale: as `StageWorker`'s, for every worker
    """

    def __init__(self, schedule: Schedule, model: ModelConfig, optim: OptimConfig, *, corpus: Corpus | None = None,
                 split: tuple[int, ...] | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 precision: Precision = "fp32", seed: int = 0, recompute: bool = False,
                 loss_scale: float | None = None) -> None:
        validate(schedule)
        self.model_config, self.optim_config, self.corpus, self.seed = model, optim, corpus, seed
        self.split = check_split(split, model.n_layers) if split else balanced_split(model.n_layers,
                                                                                      schedule.num_stages)
        if len(self.split) != schedule.num_stages:
            raise ValueError(f"layer split has {len(self.split)} stages, the schedule {schedule.num_stages}")
        missing = [s for s in range(schedule.num_stages) if not schedule.stage_peers(s)]
        if missing:
            raise ValueError(f"no peer serves stage(s) {missing}")
        self.schedule = schedule
        self.workers: dict[str, StageWorker] = {
            peer: StageWorker(peer, stage, model, self.split, optim, memory_slots=schedule.memory[peer],
                              device=device, dtype=dtype, precision=precision, seed=seed, recompute=recompute,
                              loss_scale=loss_scale)
            for peer, stage in sorted(schedule.placement.items())
        }
        holders = schedule.data_holders
        self.shards: dict[str, Shard] = {h: corpus.shard(i, len(holders)) for i, h in enumerate(holders)} \
            if corpus is not None else {}
        self.iteration = 0

    def set_schedule(self, schedule: Schedule) -> None:
        """Switch to a new epoch's routes at an iteration boundary (the placement must not change)."""
        validate(schedule)
        if schedule.placement != self.schedule.placement:
            raise ValueError("a new placement needs weights moved between peers; only new routes are supported")
        self.schedule = schedule

    def stage_workers(self, stage: int) -> list[StageWorker]:
        return [w for w in self.workers.values() if w.stage == stage]

    # ---- one iteration ----------------------------------------------------------------------
    def run_iteration(self, batches: Mapping[int, torch.Tensor] | None = None, *,
                      order: Order = "sequential") -> IterationStats:
        """Run every route of the schedule once, average within stages, step every worker once.

        :param batches: microbatch id -> tokens (B, T+1); default: the next batch of each origin's shard
        :param order: "sequential" finishes one microbatch before the next; "interleaved" keeps as many
          in flight as the peers' memory allows, runs forwards hop by hop across microbatches and
          backwards in reverse (same result up to float summation order)
        """
        start = time.perf_counter()
        routes = sorted(self.schedule.routes, key=lambda r: (r.inject_after, r.microbatch))
        tokens = {r.microbatch: self._batch_for(r, batches) for r in routes}
        losses: dict[int, float] = {}
        waves = [[r] for r in routes] if order == "sequential" else self._waves(routes)
        try:
            self._run_waves(waves, tokens, losses)
        except Exception:
            for w in self.workers.values():  # leave every worker usable for the next iteration
                w.reset()
            raise
        stage_visits = {s: average_stage(self.stage_workers(s)) for s in range(self.schedule.num_stages)}
        steps = {peer: w.step() for peer, w in self.workers.items()}
        self.iteration += 1
        n_tokens = sum(t.shape[0] * (t.shape[1] - 1) for t in tokens.values())
        return IterationStats(iteration=self.iteration, loss=sum(losses.values()) / max(1, len(losses)),
                              tokens=n_tokens, seconds=time.perf_counter() - start, stage_visits=stage_visits,
                              steps=steps)

    def _run_waves(self, waves: list[list[Route]], tokens: dict[int, torch.Tensor], losses: dict[int, float]) -> None:
        for wave in waves:
            acts = {r.microbatch: self.workers[r.origin].inject(r.microbatch, tokens[r.microbatch]) for r in wave}
            for hop in range(max(len(r.peers) for r in wave)):
                for r in wave:
                    if hop < len(r.peers):
                        acts[r.microbatch] = self.workers[r.peers[hop]].forward(r.microbatch, acts[r.microbatch],
                                                                                stage=r.stages[hop])
            grads = {}
            for r in wave:
                losses[r.microbatch], grads[r.microbatch] = self.workers[r.origin].loss(r.microbatch,
                                                                                        acts.pop(r.microbatch))
            for r in reversed(wave):
                g = grads.pop(r.microbatch)
                for stage, peer in zip(reversed(r.stages), reversed(r.peers), strict=True):
                    g = self.workers[peer].backward(r.microbatch, g, stage=stage)
                self.workers[r.origin].backward(r.microbatch, g)

    def _batch_for(self, route: Route, batches: Mapping[int, torch.Tensor] | None) -> torch.Tensor:
        if batches is not None:
            if route.microbatch not in batches:
                raise ValueError(f"no tokens given for microbatch {route.microbatch}")
            return batches[route.microbatch]
        if route.origin not in self.shards:
            raise ValueError("this swarm has no corpus: pass the iteration's microbatches explicitly")
        return self.shards[route.origin].next_batch()

    def _waves(self, routes: list[Route]) -> list[list[Route]]:
        """Group consecutive routes so that no peer holds more activations than its memory slots."""
        waves: list[list[Route]] = []
        load: dict[str, int] = {}
        for r in routes:
            nodes = r.nodes
            if not waves or any(load.get(p, 0) + 1 > self.schedule.memory[p] for p in nodes):
                waves.append([])
                load = {}
            waves[-1].append(r)
            for p in nodes:
                load[p] = load.get(p, 0) + 1
        return waves

    # ---- the trained model ------------------------------------------------------------------
    def full_model(self) -> Transformer:
        """The whole model assembled from one peer of each stage (peers of a stage hold equal weights)."""
        full = Transformer(self.model_config, seed=self.seed)
        first = next(iter(self.workers.values()))
        full.to(first.device, first.dtype)
        state = {}
        for s in range(self.schedule.num_stages):
            state.update(self.stage_workers(s)[0].module.state_dict())
        full.load_state_dict(state, strict=True)
        return full


def simple_schedule(num_peers: int, num_stages: int, skip: float, *, microbatches_per_holder: int = 4,
                    memory: int = DEFAULT_MEMORY_SLOTS, allow_swaps: bool | None = None, seed: int = 0) -> Schedule:
    """A network-oblivious schedule for in-process studies when no planner or swarm view is at hand.

    Stage groups of equal size (the remainder joins stage 0 as extra data holders); each microbatch
    takes the valid path through the least-visited stages and the least-loaded peer of each, so stage
    visits stay balanced. Swapped paths are allowed when skipping (default) and never with skip 0,
    which gives the in-order full pipeline.
    """
    if num_stages < 1 or num_peers < num_stages:
        raise ValueError(f"need at least one peer per stage: {num_peers} peers for {num_stages} stages")
    rules = PathRules.from_skip_ratio(num_stages, skip)
    rng = random.Random(seed)
    per_stage = num_peers // num_stages
    sizes = [num_peers - per_stage * (num_stages - 1)] + [per_stage] * (num_stages - 1)
    placement: dict[str, int] = {}
    for stage, size in enumerate(sizes):
        for _ in range(size):
            placement[f"peer-{len(placement):02d}"] = stage
    by_stage = {s: sorted(p for p, st in placement.items() if st == s) for s in range(num_stages)}
    swaps = skip > 0 if allow_swaps is None else allow_swaps
    candidates = [p for p in valid_stage_sequences(rules) if swaps or list(p) == sorted(p)]
    stage_load = {s: 0 for s in range(1, num_stages)}
    peer_load = dict.fromkeys(placement, 0)
    routes = []
    for k in range(microbatches_per_holder):
        for holder in by_stage[0]:
            path = min(candidates, key=lambda p: (sum(stage_load[s] for s in p), rng.random()))
            peers = []
            for s in path:
                peer = min(by_stage[s], key=lambda p: (peer_load[p], p))
                peer_load[peer] += 1
                stage_load[s] += 1
                peers.append(peer)
            routes.append(Route(microbatch=len(routes), origin=holder, stages=tuple(path), peers=tuple(peers),
                                inject_after=float(k)))
    schedule = Schedule(epoch=0, rules=rules, placement=placement, memory=dict.fromkeys(placement, memory),
                        routes=tuple(routes), planner="simple", meta={"seed": seed})
    validate(schedule)
    return schedule
