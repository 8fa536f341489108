"""Stage-group gradient averaging by all-gather over the tensor transport, robust to a faulty member.

Every peer of a stage sends its summed gradients (flattened; in float32, or rounded to bfloat16 for half the bytes,
each member rounding its own contribution too) and its visit count to the others, then each
combines the group's contributions with `peers.averaging.stage_mean`, in peer-id order, so that every member
installs bit-identical gradients and, after the optimizer step, holds bit-identical parameters. Nobody's word is
taken: a claimed visit count counts at most what the schedule gave that member (`visit_bounds`), a gradient far
larger than the stage's recent ones is refused, and with three members or more CenteredClip bounds what any one of
them can do to the mean. Every refusal is logged with a `gradient_refused` event. For the small stage groups of a
pipeline (a handful of peers) this costs one round trip;
`swarm.stage_group.hivemind_averager.StageAverager` (hivemind's DecentralizedAverager, butterfly all-reduce) is
made for large groups and large models, but it is not Byzantine-robust; `swarm.stage_group.parts_round` averages
groups of five or more by parts, robustly, at 4 (n - 1) / n gradients a member instead of n - 1.

A member that does not deliver before the deadline is left out of this round (logged): the others still
step, weighted by the visits they did receive. Where that splits the group (a member that died mid-round reached
some members whole and not others), the copies' lineages, which travel with the gradients, tell it at the next
round (`swarm.stage_group.lineage`), and the strays take the other members' state (`swarm.stage_group.mending`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import torch

from peers import flat_tensors
from peers.averaging import Aggregation, history_norm, stage_mean, visit_bounds
from peers.worker import StageWorker
from swarm.events import event
from swarm.lateness import overdue
from swarm.net.delivery import Inbound, Send
from swarm.wire import AverageStep, Direction, HopHeader

logger = logging.getLogger(__name__)

WIRE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""The dtypes stage gradients may travel in (float16 would overflow gradient sums)."""


def flatten(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """`grads` as one float32 vector (`peers.flat_tensors`)."""
    return flat_tensors.flatten(grads)


def unflatten(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`flat` as tensors shaped and typed like `like`."""
    views = flat_tensors.unflatten(flat, {n: t.shape for n, t in like.items()})
    return {n: v.to(like[n].dtype) for n, v in views.items()}


@dataclass(frozen=True)
class GroupRound:
    """What one member's round came to: the visits averaged, the members heard from (this one included), each
    heard member's lineage as it came in (`lineages`) and the weight each contribution claimed (`contributors`:
    what the next lineage is chained over)."""

    visits: int
    heard: int
    lineages: dict[str, bytes]
    contributors: dict[str, int]


def average_stage_group(*, me: str, worker: StageWorker, group: list[str], run_id: str, iteration: int, epoch: int,
                        send: Send, receive: Callable[[float], list[Inbound]], deadline: float,
                        scheduled: Mapping[str, int], aggregation: Aggregation = "centered_clip",
                        left_out: Collection[str] = (),
                        alive: Callable[[str], bool] = lambda peer: True,
                        hold: Callable[[Inbound], None] | None = None,
                        faulty: Callable[[str, str], None] | None = None, lineage: bytes = b"",
                        wire_dtype: str = "float32", late: Callable[[str, float], None] | None = None,
                        tell: Send | None = None) -> GroupRound:
    """Install the stage group's robust visit-weighted mean gradient on `worker`.

    :param group: peer ids serving this stage (this peer included)
    :param receive: this iteration's AVERAGE messages, waiting up to the timeout for the first
    :param scheduled: visits the iteration's schedule gives each peer (`Schedule.visits()`): bounds the weights
    :param aggregation: "centered_clip" (tolerates one faulty member of three or more) or "mean"
    :param left_out: members whose input is neither waited for nor taken: the scheduler's list in the commit,
      the same for every member (`Commit.left_out`). Those still `alive` are sent the others' gradients all the
      same (after the others, by `tell`), and a member left out itself sends nothing and installs the others' mean:
      a holder the commit left out for being late stays in the run, and its copy of the stage must stay the group's
    :param alive: whether a member is still worth waiting for (False once the scheduler dropped it)
    :param hold: takes messages of a newer schedule epoch for later
    :param faulty: told (member, why) of each contribution refused as proof of a fault (a gradient far outside
      the stage's history, a non-finite or misshapen one), for the scheduler; a clipped one is no proof (an honest
      outlier is clipped too), nor a weight above its bound (detours add visits to honest members)
    :param lineage: this peer's stage copy's lineage, sent with its gradients (empty: unknown)
    :param wire_dtype: "float32", or "bfloat16": every member sends its gradients rounded to bfloat16 and combines
      its own rounded the same way, so all members still combine the same values; a contribution in any other dtype
      is refused
    :param tell: sends to members left out (default `send`): a copy they may refuse (one left out for being late
      may be placed from a later iteration, or gone), whose failure says nothing of their reachability
    :param late: told (member, seconds) once of each member still awaited when half of the others' contributions
      came and it is late against their median (`swarm.lateness`): the caller probes it, since a frozen
      member resets nothing and would be waited for until it is declared gone
    """
    def refuse(sender: str, why: str, proof: bool = False) -> None:
        logger.warning("stage %d averaging of iteration %d, gradients of %s: %s", worker.stage, iteration, sender,
                       why, extra=event("gradient_refused", stage=worker.stage, iteration=iteration, sender=sender,
                                        why=why))
        if proof and faulty is not None:
            faulty(sender, why)

    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype must be one of {', '.join(WIRE_DTYPES)}, got {wire_dtype!r}")
    sums = worker.gradient_sums()
    flat = flatten(sums).to(WIRE_DTYPES[wire_dtype])  # what goes on the wire, and what this member combines
    excused = me in left_out
    contributions: dict[str, tuple[torch.Tensor, int]] = {} if excused else {me: (flat, worker.visits)}
    lineages = {me: lineage}
    others = sorted(p for p in group if p != me and p not in left_out)
    listeners = sorted(p for p in group if p != me and p in left_out and alive(p))
    for peer in [] if excused else others + listeners:
        header = HopHeader(run=run_id, iteration=iteration, microbatch=0, route=(me, peer), hop=1,
                           direction=Direction.AVERAGE, epoch=epoch, dtype="", shape=(),
                           stages=(worker.stage, worker.stage), weight=worker.visits, lineage=lineage)
        (send if peer in others else tell or send)(peer, header, flat)
    began = time.monotonic()
    end = began + deadline
    arrived: list[float] = []
    told: set[str] = set()
    while time.monotonic() < end and any(p not in contributions and alive(p) for p in others):
        behind = overdue(arrived, len(others) - len(arrived), time.monotonic() - began) if late else None
        if behind is not None:
            for p in others:
                if p not in contributions and p not in told:
                    told.add(p)
                    late(p, behind)
        for m in receive(min(0.2, max(0.0, end - time.monotonic()))):
            h = m.header
            if h.epoch != epoch:
                if h.epoch > epoch and hold is not None:
                    hold(m)
                else:
                    logger.warning("dropped gradients from %s: schedule epoch %d, this round is epoch %d", m.sender,
                                   h.epoch, epoch)
            elif m.sender not in others or h.route != (m.sender, me):
                refuse(m.sender, f"refused: not a member of stage {worker.stage}'s group")
            elif h.stages and h.stages[0] != worker.stage:
                refuse(m.sender, f"refused: stage {h.stages[0]}, this group is stage {worker.stage}")
            elif h.average_step != AverageStep.WHOLE:
                refuse(m.sender, f"refused: a {h.average_step.name.lower()} message, this group all-gathers")
            elif m.tensor.shape != flat.shape or m.tensor.dtype != flat.dtype or not torch.isfinite(m.tensor).all():
                refuse(m.sender, f"refused: {tuple(m.tensor.shape)} {m.tensor.dtype}, expected finite "
                       f"{tuple(flat.shape)} {flat.dtype}", proof=True)
            elif m.sender in contributions:
                logger.warning("dropped duplicate gradients from %s", m.sender)
            else:
                contributions[m.sender] = (m.tensor, h.weight)
                lineages[m.sender] = h.lineage
                arrived.append(time.monotonic() - began)
    missing = [p for p in others if p not in contributions]
    if missing:
        logger.warning("stage %d averaging of iteration %d went ahead without %s", worker.stage, iteration, missing)
    if not contributions:  # left out, and no mate's gradients came: this copy steps alone, and is mended later
        contributions[me] = (flat, worker.visits)
    order = sorted(contributions)  # every member combines in peer-id order: bit-identical means
    bounds = visit_bounds(scheduled, group, order)
    result = stage_mean([contributions[p][0].float() for p in order], [contributions[p][1] for p in order],
                        bounds=[bounds[p] for p in order], reference=history_norm(worker), aggregation=aggregation)
    for i, why in sorted(result.refused.items()):
        refuse(order[i], why, proof=why.startswith("refused"))
    worker.set_mean_gradients(unflatten(result.mean, sums), result.visits)
    return GroupRound(result.visits, len(contributions), lineages, {p: contributions[p][1] for p in order})
