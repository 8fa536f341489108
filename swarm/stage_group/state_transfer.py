"""Hand a stage's current state (weights and AdamW moments) to a peer joining that stage, over the transport.

Two STATE messages from an existing member to the newcomer, at the iteration boundary where the newcomer
starts: part 0 is the stage's weights, part 1 its optimizer moments (exp_avg, exp_avg_sq, step per
parameter; zeros and step 0 where the sender has none yet), both flattened in name order; the header's
`weight` carries the optimizer step count plus one. The newcomer checks the sizes against its own (same-stage)
model, and that every value is finite and every step count and second moment non-negative, before loading
anything (`check_state`).

A joiner does not take one volunteer's word for its stage: where the stage has two veterans or more, the first two
send the whole state and the others its digest (part 2: the SHA-256 of steps, weights and moments), and the joiner
loads a state whose digest two of them agree on (`receive_agreed_state`). The members of a stage group hold
bit-identical state (their averaging installs identical gradients) on identical hardware, so honest digests agree,
and two whole states within rounding of each other count as agreeing; one faulty veteran is out-voted once three are
there, and with two it can stop the join but not poison it. With hivemind's averager the members agree only to
rounding, and only one veteran sends: its state is taken, as before.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Collection, Mapping

import torch

from peers.checkpoint import load_stage_tensors, stage_tensors
from peers.flat_tensors import flatten, unflatten
from peers.worker import StageWorker, WorkerError
from scheduler.schedule import Schedule
from swarm.events import event
from swarm.net.delivery import Inbound, Send
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)

MOMENTS = ("exp_avg", "exp_avg_sq", "step")
WEIGHTS, OPTIMIZER, DIGEST = 0, 1, 2
"""Parts of a state transfer (the header's `microbatch`)."""
STATE_TOLERANCE = 1e-4
"""Two veterans' states this close (relative L2 of weights, and of moments) agree though their digests differ."""


def _optimizer_template(worker: StageWorker) -> dict[str, torch.Size]:
    shapes = {}
    for name, p in worker.module.named_parameters():
        for key in MOMENTS:
            shapes[f"{name}.{key}"] = p.shape if key != "step" else torch.Size([1])
    return shapes


def state_parts(worker: StageWorker) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat weights, flat optimizer moments) of `worker`, in a layout every peer of the stage shares."""
    weights, optim = stage_tensors(worker)
    moments = {key: optim[key] if key in optim else torch.zeros(shape)
               for key, shape in _optimizer_template(worker).items()}
    return flatten(weights), flatten(moments)


def state_digest(weights: torch.Tensor, moments: torch.Tensor, steps: int) -> bytes:
    """SHA-256 of a stage's state as it travels: its step count, then parts 0 and 1 (float32 bytes)."""
    h = hashlib.sha256(int(steps).to_bytes(8, "little", signed=True))
    for t in (weights, moments):
        h.update(memoryview(t.detach().to(torch.float32).contiguous().cpu().numpy()).cast("B"))
    return h.digest()


def _header(me: str, worker: StageWorker, to: str, run_id: str, iteration: int, epoch: int, part: int) -> HopHeader:
    return HopHeader(run=run_id, iteration=iteration, microbatch=part, route=(me, to), hop=1,
                     direction=Direction.STATE, epoch=epoch, dtype="", shape=(), stages=(worker.stage, worker.stage),
                     weight=worker.steps + 1)


def send_state(*, me: str, worker: StageWorker, to: str, run_id: str, iteration: int, epoch: int, send: Send) -> None:
    for part, tensor in enumerate(state_parts(worker)):
        send(to, _header(me, worker, to, run_id, iteration, epoch, part), tensor)


def send_digest(*, me: str, worker: StageWorker, to: str, run_id: str, iteration: int, epoch: int,
                send: Send) -> None:
    """Vouch for this stage's state to a joiner without sending it: part 2, its digest as 32 bytes."""
    digest = state_digest(*state_parts(worker), worker.steps)
    send(to, _header(me, worker, to, run_id, iteration, epoch, DIGEST), torch.frombuffer(bytearray(digest),
                                                                                         dtype=torch.uint8))


def state_senders(schedule: Schedule, stage: int) -> list[str]:
    """The peers that equip a joiner of `stage` under `schedule`: its veterans (not joining, not moved in or
    restarted this epoch), in order; the first two send the state, the others its digest."""
    joiners = set(schedule.meta.get("joiners", ()))
    moved = set()
    for key in ("handover", "restore"):
        table = schedule.meta.get(key)
        moved |= set(table) if isinstance(table, dict) else set()
    return [p for p in schedule.stage_peers(stage) if p not in joiners and p not in moved]


def unflatten_weights(flat: torch.Tensor, template: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Part 0 of a state transfer as named tensors, given the sender's stage layout (names and shapes); refuses
    sizes that do not match and non-finite weights."""
    if flat.dtype != torch.float32 or not bool(torch.isfinite(flat).all()):
        raise WorkerError("state transfer weights are not finite float32")
    try:
        return unflatten(flat, template)
    except ValueError:
        raise WorkerError("state transfer sizes do not match the sending stage's model") from None


def check_state(worker: StageWorker, messages: Mapping[int, Inbound]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
    """Parts 0 and 1 as (weights, optimizer state, steps) for `worker`'s stage, or WorkerError: missing parts,
    another stage's layout, non-finite values, a negative step count or second moment."""
    if not {WEIGHTS, OPTIMIZER} <= set(messages):
        raise WorkerError(f"state transfer needs parts 0 and 1, got {sorted(messages)}")
    steps = messages[WEIGHTS].header.weight - 1
    if steps < 0 or messages[OPTIMIZER].header.weight != steps + 1:
        raise WorkerError(f"state transfer step counts {messages[WEIGHTS].header.weight - 1} and "
                          f"{messages[OPTIMIZER].header.weight - 1}: need one count, not negative")
    return check_flat_state(worker, messages[WEIGHTS].tensor, messages[OPTIMIZER].tensor, steps)


def check_flat_state(worker: StageWorker, flat_weights: torch.Tensor, flat_moments: torch.Tensor, steps: int
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
    """`state_parts` of a stage as (weights, optimizer state, steps) for `worker`'s stage, or WorkerError: another
    stage's layout, non-finite values, a negative second moment, a step count that is not a whole number up to
    `steps`."""
    template_w = dict(worker.module.state_dict())
    if flat_moments.dtype != torch.float32 or not bool(torch.isfinite(flat_moments).all()):
        raise WorkerError("state transfer optimizer moments are not finite float32")
    try:
        moments = unflatten(flat_moments, _optimizer_template(worker))
    except ValueError:
        raise WorkerError("state transfer sizes do not match this stage's model") from None
    for key, t in moments.items():
        if key.endswith((".exp_avg_sq", ".step")) and bool((t < 0).any()):
            raise WorkerError(f"state transfer {key} is negative")
        if key.endswith(".step") and (float(t) != int(float(t)) or float(t) > steps):
            raise WorkerError(f"state transfer {key} = {float(t)} is not a whole count up to {steps}")
    weights = unflatten_weights(flat_weights, {k: v.shape for k, v in template_w.items()})
    weights = {k: v.to(template_w[k].dtype) for k, v in weights.items()}
    optim = {k: t.reshape(()) if k.endswith(".step") else t for k, t in moments.items()}
    return weights, optim, steps


def load_state(worker: StageWorker, messages: Mapping[int, Inbound]) -> int:
    """Load parts 0 and 1 into `worker`; returns the optimizer step count. Raises WorkerError on a mismatch, or on
    state that is not finite or counts negative steps (`check_state`), before changing anything."""
    weights, optim, steps = check_state(worker, messages)
    load_stage_tensors(worker, weights, optim, steps=steps)
    return steps


def receive_agreed_state(worker: StageWorker, receive: Callable[[float], list[Inbound]], *, senders: Collection[str],
                         needed: int, timeout: float,
                         electorate: Callable[[], tuple[Collection[str], int]] | None = None,
                         progress: Callable[[], int] | None = None) -> dict[int, Inbound]:
    """Parts 0 and 1 of a state for `worker`'s stage whose digest `needed` of `senders` agree on (a sender of the
    whole state, checked by `check_state`, vouches for its digest; a sender of part 2 for the digest it sent). Two
    whole states within `STATE_TOLERANCE` of each other vouch for each other: members on different hardware (a GPU
    and a CPU) round AdamW's step differently, so their states drift apart by a few units in the last place.

    `electorate`, if given, is asked before each read for the senders and the voices needed now: a re-plan of the
    joiner's iteration names fewer veterans once one is taken for gone (a frozen veteran must not hold a joiner up
    past its declaration), and what a sender no longer named said stops counting. It may raise to stop the wait.

    `progress`, if given, counts the state bytes received so far (the pieces of a state too large for one message
    included: `swarm.peer.message_chunks`): the wait then ends `timeout` seconds after the last of them, so that a
    large state on a slow link is not given up on while it is still coming.

    State from anyone else, state that fails `check_state` and a second copy from one sender are refused (a
    `state_refused` event each). Raises TimeoutError if no state gathers `needed` voices within `timeout`.
    """
    parts: dict[str, dict[int, Inbound]] = {}
    voices: dict[bytes, set[str]] = {}
    states: dict[bytes, dict[int, Inbound]] = {}
    near: dict[bytes, set[bytes]] = {}
    spoken: set[str] = set()

    def refuse(sender: str, why: str) -> None:
        logger.warning("stage %d state from %s refused: %s", worker.stage, sender, why,
                       extra=event("state_refused", stage=worker.stage, sender=sender, why=why))

    end = time.monotonic() + timeout
    arrived = progress() if progress is not None else 0
    while time.monotonic() < end:
        if progress is not None and progress() != arrived:
            arrived, end = progress(), time.monotonic() + timeout
        if electorate is not None:
            senders, needed = electorate()
        for m in receive(min(0.5, max(0.0, end - time.monotonic()))):
            part = m.header.microbatch
            if m.sender not in senders:
                refuse(m.sender, f"not a veteran of stage {worker.stage}")
            elif m.sender in spoken or part not in (WEIGHTS, OPTIMIZER, DIGEST) or part in parts.get(m.sender, {}):
                refuse(m.sender, f"part {part} unexpected or sent twice")
            elif part == DIGEST:
                if m.tensor.dtype != torch.uint8 or m.tensor.numel() != 32:
                    refuse(m.sender, "a digest is 32 bytes")
                    continue
                spoken.add(m.sender)
                voices.setdefault(bytes(m.tensor.tolist()), set()).add(m.sender)
            else:
                mine = parts.setdefault(m.sender, {})
                mine[part] = m
                if len(mine) < 2:
                    continue
                spoken.add(m.sender)
                try:
                    _, _, steps = check_state(worker, mine)
                except WorkerError as e:
                    refuse(m.sender, str(e))
                    continue
                digest = state_digest(mine[WEIGHTS].tensor, mine[OPTIMIZER].tensor, steps)
                voices.setdefault(digest, set()).add(m.sender)
                if digest not in states:
                    near[digest] = {d for d, other in states.items() if _close(mine, other)}
                    for d in near[digest]:
                        near[d].add(digest)
                    states[digest] = mine
        for digest, state in states.items():
            support = voices[digest].union(*(voices[d] for d in near[digest])) & set(senders)
            if support and len(support) >= needed:
                for sender in sorted(set().union(*voices.values()).intersection(senders) - support):
                    refuse(sender, f"its state is not the one {sorted(support)} agree on")
                return state
    raise TimeoutError(f"no state for stage {worker.stage} that {needed} of {sorted(senders)} agree on in time "
                       f"(heard: {sorted(len(v) for v in voices.values())} voices per digest)")


def _close(a: Mapping[int, Inbound], b: Mapping[int, Inbound]) -> bool:
    """Whether two checked states have one step count and differ by at most `STATE_TOLERANCE` (relative L2)."""
    if a[WEIGHTS].header.weight != b[WEIGHTS].header.weight:
        return False
    for part in (WEIGHTS, OPTIMIZER):
        x, y = a[part].tensor.double(), b[part].tensor.double()
        if float((x - y).norm()) > STATE_TOLERANCE * float(x.norm()):
            return False
    return True
