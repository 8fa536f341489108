"""Stage-group gradient averaging by all-gather over the tensor transport.

Every peer of a stage sends its summed gradients (flattened) and its visit count to the others, then each
computes sum(sums) / sum(visits) over the group, adding in peer-id order, so that every member installs
bit-identical gradients and, after the optimizer step, holds bit-identical parameters. For the small stage
groups of a pipeline (a handful of peers) this costs one round trip;
`swarm.stage_group.hivemind_averager.StageAverager` (hivemind's DecentralizedAverager, butterfly all-reduce) is
the choice for large groups and large models.

A member that does not deliver before the deadline is left out of this round (logged): the others still
step, weighted by the visits they did receive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from peers import flat_tensors
from peers.averaging import mean_by_visits
from peers.worker import StageWorker
from swarm.net.delivery import Inbound, Send
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)


def flatten(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """`grads` as one float32 vector (`peers.flat_tensors`)."""
    return flat_tensors.flatten(grads)


def unflatten(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`flat` as tensors shaped and typed like `like`."""
    views = flat_tensors.unflatten(flat, {n: t.shape for n, t in like.items()})
    return {n: v.to(like[n].dtype) for n, v in views.items()}


def average_stage_group(*, me: str, worker: StageWorker, group: list[str], run_id: str, iteration: int, epoch: int,
                        send: Send, receive: Callable[[float], list[Inbound]], deadline: float,
                        alive: Callable[[str], bool] = lambda peer: True,
                        hold: Callable[[Inbound], None] | None = None) -> tuple[int, int]:
    """Install the stage group's visit-weighted mean gradient on `worker`.

    :param group: peer ids serving this stage (this peer included)
    :param receive: this iteration's AVERAGE messages, waiting up to the timeout for the first
    :param alive: whether a member is still worth waiting for (False once the scheduler dropped it)
    :param hold: takes messages of a newer schedule epoch for later
    :returns: (total visits averaged, members heard from, this peer included)
    """
    sums = worker.gradient_sums()
    flat = flatten(sums)
    contributions: dict[str, tuple[torch.Tensor, int]] = {me: (flat, worker.visits)}
    others = sorted(p for p in group if p != me)
    for peer in others:
        header = HopHeader(run=run_id, iteration=iteration, microbatch=0, route=(me, peer), hop=1,
                           direction=Direction.AVERAGE, epoch=epoch, dtype="", shape=(),
                           stages=(worker.stage, worker.stage), weight=worker.visits)
        send(peer, header, flat)
    end = time.monotonic() + deadline
    while time.monotonic() < end and any(p not in contributions and alive(p) for p in others):
        for m in receive(min(0.2, max(0.0, end - time.monotonic()))):
            h = m.header
            if h.epoch != epoch:
                if h.epoch > epoch and hold is not None:
                    hold(m)
                else:
                    logger.warning("dropped gradients from %s: schedule epoch %d, this round is epoch %d", m.sender,
                                   h.epoch, epoch)
            elif m.sender not in others or h.route != (m.sender, me):
                logger.warning("dropped gradients from %s: not a member of stage %d's group", m.sender, worker.stage)
            elif h.stages and h.stages[0] != worker.stage:
                logger.warning("dropped gradients from %s: stage %d, this group is stage %d", m.sender, h.stages[0],
                               worker.stage)
            elif m.tensor.shape != flat.shape or m.tensor.dtype != flat.dtype or not torch.isfinite(m.tensor).all():
                logger.warning("dropped gradients from %s: %s %s, expected finite %s %s", m.sender,
                               tuple(m.tensor.shape), m.tensor.dtype, tuple(flat.shape), flat.dtype)
            elif m.sender in contributions:
                logger.warning("dropped duplicate gradients from %s", m.sender)
            else:
                contributions[m.sender] = (m.tensor, h.weight)
    missing = [p for p in others if p not in contributions]
    if missing:
        logger.warning("stage %d averaging of iteration %d went ahead without %s", worker.stage, iteration, missing)
    order = sorted(contributions)  # every member adds in peer-id order: bit-identical means
    mean, total = mean_by_visits([contributions[p][0] for p in order], [contributions[p][1] for p in order])
    worker.set_mean_gradients(unflatten(mean, sums), total)
    return total, len(contributions)
