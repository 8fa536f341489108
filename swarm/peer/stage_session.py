"""`StageSession`: a peer's stage while it serves it: the worker, and the averager of its stage group.

A session belongs to one stage: a peer moved to another stage closes its session and builds a new one rather
than mutating the old in place. A new session starts from the run's seed or, when the run starts from a checkpoint's
weights (`run.init_weights`), from this peer's copy of that checkpoint (the first placement), from a same-stage
peer's weights and optimizer state (a joiner or a mover), from this peer's own checkpoint, or from a neighbouring
stage's decoder blocks (a stage that lost every peer). The functions below build and equip sessions; state
arrives through the peer's inbox as two STATE messages (`swarm.stage_group.state_transfer`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from hivemind import DHT

from peers.averaging import mean_by_visits
from peers.checkpoint import (
    CheckpointError,
    initial_weight_digests,
    load_initial_stage,
    load_stage_checkpoint,
    load_stage_tensors,
)
from peers.model import ModelConfig
from peers.paced_worker import PacedWorker
from peers.stage import balanced_split, neighbour_blocks, stage_template
from peers.worker import StageWorker, WorkerError
from scheduler.schedule import Schedule
from swarm.events import event
from swarm.net.delivery import Inbound
from swarm.peer.mailbox import Inbox
from swarm.peer.members import NotAdmitted
from swarm.run_config import RunConfig
from swarm.stage_group.allgather import flatten, unflatten
from swarm.stage_group.state_transfer import check_flat_state, state_parts, unflatten_weights
from swarm.wire import Direction

logger = logging.getLogger(__name__)


class InitialWeightsRefused(NotAdmitted):
    """This peer cannot start from the run's initial weights: no copy of them, or a copy whose files differ."""


class StageSession:
    """Stage `stage` served by one worker; its hivemind averager (when the run averages with hivemind) is made on
    first use and closed with the session.

    :param dht: returns the peer's DHT (the averager meets its group there)
    """

    def __init__(self, stage: int, worker: StageWorker, *, run_id: str, dht: Callable[[], DHT]) -> None:
        self.stage, self.worker, self.run_id = stage, worker, run_id
        self._dht = dht
        self._averager = None
        self._state_averager = None
        self.drifted = False
        """This peer's state may differ from its group's (hivemind): it stepped without a whole round."""
        self._resync_with = 0
        """Members of the last round, when that round asked them to average their whole state after the step."""
        self.lineage = b""
        """All-gather: the rounds this copy stepped with, chained (`swarm.stage_group.lineage`); empty until its
        first round (a new session takes its group's)."""

    def average_with_hivemind(self, group_size: int, timeout: float, *, left_out: bool = False) -> tuple[int, int]:
        """The stage group's visit-weighted mean through hivemind's DecentralizedAverager: (visits, members heard).

        Its butterfly all-reduce hands each peer `local + (mean - local)`, so peers agree only up to float
        rounding (while every round is whole: `swarm.stage_group.hivemind_averager`); averaging in float64 keeps
        that far below float32 resolution. A member the commit left out (`left_out`: a holder whose draws went back,
        to be drawn again) contributes nothing, weight 0 and zeros, and installs its group's mean, as in the
        all-gather: its copy of the stage stays its group's, and its uncounted microbatches are not learnt twice.
        """
        from swarm.stage_group.hivemind_averager import StageAverager

        worker = self.worker
        sums = worker.gradient_sums()
        flat = flatten(sums).double()
        weight = 0 if left_out else worker.visits
        own = torch.zeros_like(flat) if left_out else mean_by_visits([flat], [weight])[0]
        if group_size < 2:
            worker.set_mean_gradients(unflatten(own, sums), weight)
            return weight, 1
        if self._averager is None:
            self._averager = StageAverager(self._dht(), run_id=self.run_id, stage=self.stage, tensors=[own],
                                           target_group_size=group_size, min_matchmaking_time=1.0,
                                           round_timeout=timeout)
        result = self._averager.average([own], weight, timeout=timeout, drifted=self.drifted)
        worker.set_mean_gradients(unflatten(own, sums), round(result.total_weight))
        self.drifted = self.drifted or not result.averaged or result.received < 1.0
        self._resync_with = result.group_size if result.resync else 0
        return round(result.total_weight), result.group_size

    def resync_state(self, timeout: float) -> bool:
        """After the step that followed a hivemind round asking for it (`AveragingResult.resync`): average the
        stage's whole state (weights and AdamW moments, in float64) with that round's members, so copies that
        drifted apart agree again. A state the round hands back that does not fit (sizes, non-finite values, step
        counts) is refused and this peer keeps its own. True if a whole round replaced the state."""
        from swarm.stage_group.hivemind_averager import StageAverager

        if not self._resync_with:
            return False
        members, self._resync_with = self._resync_with, 0
        worker = self.worker
        weights, moments = state_parts(worker)
        flat = torch.cat([weights, moments]).double()
        if self._state_averager is None:
            self._state_averager = StageAverager(self._dht(), run_id=self.run_id, stage=self.stage, tensors=[flat],
                                                 target_group_size=members, min_matchmaking_time=1.0,
                                                 round_timeout=timeout, name="state")
        result = self._state_averager.average([flat], 1.0, timeout=timeout)
        if not result.averaged:
            return False
        try:
            mean_weights, mean_moments = flat.float().split([weights.numel(), moments.numel()])
            load_stage_tensors(worker, *check_flat_state(worker, mean_weights, mean_moments, worker.steps)[:2],
                               steps=worker.steps)
        except (WorkerError, CheckpointError) as e:
            logger.warning("stage %d: the averaged state does not fit: %s; keeping this peer's own", self.stage, e)
            return False
        self.drifted = result.received < 1.0
        logger.info("stage %d: %d members averaged their whole state (%.1f%% arrived)", self.stage,
                    result.group_size, 100 * result.received,
                    extra=event("state_resynced", stage=self.stage, members=result.group_size,
                                received=round(result.received, 4)))
        return not self.drifted

    def close(self) -> None:
        for averager in (self._averager, self._state_averager):
            if averager is not None:
                averager.shutdown()
        self._averager = self._state_averager = None


def new_worker(peer_id: str, stage: int, schedule: Schedule, model_config: ModelConfig, config: RunConfig, *,
               device: str, precision: str, emulate_seconds_per_layer: float | None = None,
               loss_seconds: float = 0.0) -> StageWorker:
    """A fresh worker for `stage` in `schedule`, from the run's seed (paced to an emulated device, if any)."""
    split = balanced_split(model_config.n_layers, schedule.num_stages)
    kwargs = {"memory_slots": schedule.memory[peer_id], "device": device, "precision": precision, "seed": config.seed,
              "recompute": config.recompute, "loss_scale": config.loss_scale}
    if emulate_seconds_per_layer:
        return PacedWorker(peer_id, stage, model_config, split, config.optim,
                           seconds_per_layer=emulate_seconds_per_layer, loss_seconds=loss_seconds, **kwargs)
    return StageWorker(peer_id, stage, model_config, split, config.optim, **kwargs)


def check_initial_weights(init_from: str | None, config: RunConfig, model_config: ModelConfig) -> None:
    """Refuse this peer's `--init-from` checkpoint unless it holds exactly the run's initial weights (the digests
    the run spec carries, every stage's): a volunteer with other files learns it on joining, not after placement.
    A run started from its seed refuses an --init-from (the volunteer meant another run). Without --init-from the
    peer may still join a run that started from a checkpoint once it runs: a same-stage peer sends the state.

    :raises InitialWeightsRefused: the message says what differs and how to fix it
    """
    if not init_from:
        return
    if not config.init_weights:
        raise InitialWeightsRefused(f"--init-from {init_from}: this run starts from its seed, not from a checkpoint's "
                                    "weights; drop --init-from")
    split = balanced_split(model_config.n_layers, config.stages)
    try:
        mine = initial_weight_digests(init_from, model_config, split)
    except CheckpointError as e:
        raise InitialWeightsRefused(f"--init-from {init_from} cannot start this run: {e}") from None
    for stage, (ours, theirs) in enumerate(zip(mine, config.init_weights, strict=True)):
        if ours != theirs:
            raise InitialWeightsRefused(f"--init-from {init_from}: stage-{stage}.safetensors is not this run's "
                                        f"initial weights (SHA-256 {ours[:12]}..., the run's is {theirs[:12]}...): "
                                        "point --init-from at a copy of the checkpoint the run started from")


def start_from_initial_weights(worker: StageWorker, init_from: str | None, config: RunConfig) -> None:
    """Iteration 0 of a run started from a checkpoint's weights: `worker`'s stage from this peer's copy of it,
    optimizer fresh. A peer without a copy cannot start then (it may join once the run runs).

    :raises InitialWeightsRefused: no --init-from, or its stage file is not the run's
    """
    if not init_from:
        raise InitialWeightsRefused("this run starts from a checkpoint's weights (run.init_from): pass --init-from "
                                    "DIR, a copy of it, or join once the run has started (a same-stage peer then "
                                    "sends the state)")
    try:
        load_initial_stage(init_from, worker, config.init_weights[worker.stage])
    except CheckpointError as e:
        raise InitialWeightsRefused(f"--init-from {init_from}: {e}") from None
    logger.info("stage %d starts from the run's initial weights in %s", worker.stage, init_from,
                extra=event("stage_loaded", stage=worker.stage, source="init_from"))


def restore_source(schedule: Schedule, peer: str) -> str | None:
    """The peer a joiner of a stage that lost every peer starts from (the scheduler's choice), if any."""
    restore = schedule.meta.get("restore")
    source = restore.get(peer) if isinstance(restore, dict) else None
    return source if isinstance(source, str) and source in schedule.placement else None


def receive_state(inbox: Inbox, schedule: Schedule, stage: int, source: str | None, timeout: float, *,
                  expect: Callable[[], None] | None = None,
                  source_gone: Callable[[], bool] = lambda: False) -> dict[int, Inbound]:
    """The two parts of a stage's state, from a peer of `stage` in `schedule` (or from `source`, whatever its
    stage); state from anyone else is dropped. Raises TimeoutError if they do not come within `timeout` (after the
    last piece of a state too large for one message, while its pieces come), or as soon as `source_gone` says the
    scheduler declared `source` gone before anything of its state came. `expect`, if given, is called before each
    read: it names the senders to the transport, which takes their state only for a while after."""
    end = time.monotonic() + timeout
    parts: dict[int, Inbound] = {}
    arrived = inbox.assembly.arrived[Direction.STATE]
    while len(parts) < 2 and time.monotonic() < end:
        if expect is not None:
            expect()
        if inbox.assembly.arrived[Direction.STATE] != arrived:  # pieces of a large state: still coming
            arrived, end = inbox.assembly.arrived[Direction.STATE], time.monotonic() + timeout
        elif not parts and source is not None and source_gone():  # a dead source sends nothing: no use waiting
            raise TimeoutError(f"{source} was declared gone before its state for stage {stage} came")
        for m in inbox.receive("state", 0.5, any_iteration=True):
            same_stage = schedule.placement.get(m.sender) == stage
            if m.sender == source or (source is None and same_stage):
                parts[m.header.microbatch] = m
            else:
                logger.warning("dropped stage state from %s: not %s", m.sender, source or f"a peer of stage {stage}")
    if len(parts) < 2:
        raise TimeoutError(f"{source or 'no same-stage peer'} sent no state for stage {stage} in time")
    return parts


def restart_stage(worker: StageWorker, stage: int, schedule: Schedule, model_config: ModelConfig, *,
                  source: str, source_stage: int, checkpoint_dir: str | None,
                  receive: Callable[[], dict[int, Inbound]]) -> None:
    """Restart a stage nobody kept serving: from this peer's own checkpoint of it if it has one, else from the
    decoder blocks of `source`, a peer of a neighbouring stage (`receive` gets its state; the optimizer starts
    afresh)."""
    if checkpoint_dir:
        try:
            manifest = load_stage_checkpoint(checkpoint_dir, worker)
            logger.warning("stage %d had no peer left: restored it from this peer's checkpoint of iteration %d",
                           stage, manifest["iteration"],
                           extra=event("stage_loaded", stage=stage, source="checkpoint",
                                       iteration=manifest["iteration"]))
            return
        except CheckpointError as e:
            logger.info("no usable checkpoint of stage %d here (%s)", stage, e)
    parts = receive()
    split = balanced_split(model_config.n_layers, schedule.num_stages)
    theirs = unflatten_weights(parts[0].tensor, stage_template(model_config, split, source_stage))
    steps = parts[0].header.weight - 1
    load_stage_tensors(worker, neighbour_blocks(worker.module, theirs), {}, steps=steps)
    logger.warning("stage %d had no peer left and no checkpoint here: initialised it from stage %d's blocks "
                   "(from %s, step %d)", stage, source_stage, source, steps,
                   extra=event("stage_loaded", stage=stage, source="blocks", peer=source, steps=steps,
                               from_stage=source_stage))
