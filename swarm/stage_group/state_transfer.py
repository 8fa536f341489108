"""Hand a stage's current state (weights and AdamW moments) to a peer joining that stage, over the transport.

Two STATE messages from an existing member to the newcomer, at the iteration boundary where the newcomer
starts: part 0 is the stage's weights, part 1 its optimizer moments (exp_avg, exp_avg_sq, step per
parameter; zeros and step 0 where the sender has none yet), both flattened in name order; the header's
`weight` carries the optimizer step count. The newcomer checks the sizes against its own (same-stage)
model before loading anything.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from peers.checkpoint import load_stage_tensors, stage_tensors
from peers.flat_tensors import flatten, unflatten
from peers.worker import StageWorker, WorkerError
from swarm.net.delivery import Inbound, Send
from swarm.wire import Direction, HopHeader

MOMENTS = ("exp_avg", "exp_avg_sq", "step")


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


def send_state(*, me: str, worker: StageWorker, to: str, run_id: str, iteration: int, epoch: int, send: Send) -> None:
    for part, tensor in enumerate(state_parts(worker)):
        header = HopHeader(run=run_id, iteration=iteration, microbatch=part, route=(me, to), hop=1,
                           direction=Direction.STATE, epoch=epoch, dtype="", shape=(),
                           stages=(worker.stage, worker.stage), weight=worker.steps + 1)
        send(to, header, tensor)


def unflatten_weights(flat: torch.Tensor, template: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Part 0 of a state transfer as named tensors, given the sender's stage layout (names and shapes)."""
    try:
        return unflatten(flat, template)
    except ValueError:
        raise WorkerError("state transfer sizes do not match the sending stage's model") from None


def load_state(worker: StageWorker, messages: dict[int, Inbound]) -> int:
    """Load parts 0 and 1 into `worker`; returns the optimizer step count. Raises WorkerError on a mismatch."""
    if set(messages) != {0, 1}:
        raise WorkerError(f"state transfer needs parts 0 and 1, got {sorted(messages)}")
    template_w = {k: v for k, v in worker.module.state_dict().items()}
    try:
        moments = unflatten(messages[1].tensor, _optimizer_template(worker))
    except ValueError:
        raise WorkerError("state transfer sizes do not match this stage's model") from None
    weights = unflatten_weights(messages[0].tensor, {k: v.shape for k, v in template_w.items()})
    weights = {k: v.to(template_w[k].dtype) for k, v in weights.items()}
    optim = {k: t.reshape(()) if k.endswith(".step") else t for k, t in moments.items()}
    steps = messages[0].header.weight - 1
    load_stage_tensors(worker, weights, optim, steps=steps)
    return steps
