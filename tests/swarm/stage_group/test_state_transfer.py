"""A stage's weights and optimizer state, sent as two STATE messages, restore a fresh worker of that stage
exactly; a transfer from another stage's layout, or an incomplete one, is refused with a WorkerError."""

from __future__ import annotations

import pytest
import torch

from peers.checkpoint import stage_tensors
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker, WorkerError
from swarm.net.delivery import Inbound
from swarm.stage_group.state_transfer import load_state, send_state
from swarm.wire import Direction, HopHeader

MICRO = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
SPLIT = (2, 1, 1)


def worker(peer: str, stage: int, seed: int = 0) -> StageWorker:
    return StageWorker(peer, stage, MICRO, SPLIT, OptimConfig(grad_clip=0), seed=seed)


def stepped(stage: int, steps: int) -> StageWorker:
    """A worker that trained `steps` optimizer steps on random activations."""
    w = worker("sender", stage)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        out = w.forward(step, torch.randn(2, 8, MICRO.dim, generator=gen))
        w.backward(step, torch.randn(out.shape, generator=gen))
        w.set_mean_gradients(w.gradient_sums(), w.visits)
        w.step()
    return w


def transferred(sender: StageWorker, to: str = "joiner") -> dict[int, Inbound]:
    """The STATE messages `sender` sends to `to`, as the receiver's inbox would hold them (by part)."""
    sent: dict[int, Inbound] = {}

    def send(peer: str, header: HopHeader, tensor: torch.Tensor) -> None:
        assert peer == to and header.direction == Direction.STATE and header.route == ("sender", to)
        sent[header.microbatch] = Inbound("sender", header, tensor.clone())

    send_state(me="sender", worker=sender, to=to, run_id="r", iteration=7, epoch=1, send=send)
    return sent


def test_a_joiner_restores_the_stage_exactly():
    sender = stepped(stage=1, steps=3)
    joiner = worker("joiner", 1, seed=5)  # other initial weights: everything must come from the transfer
    assert load_state(joiner, transferred(sender)) == sender.steps == 3
    theirs, ours = stage_tensors(sender), stage_tensors(joiner)
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.keys() == other.keys()
        for k in mine:
            torch.testing.assert_close(mine[k].float().reshape(-1), other[k].float().reshape(-1), rtol=0, atol=0)
    # both take the same next step from here
    gen = torch.Generator().manual_seed(9)
    x, g = torch.randn(2, 8, MICRO.dim, generator=gen), torch.randn(2, 8, MICRO.dim, generator=gen)
    for w in (sender, joiner):
        w.forward(100, x)
        w.backward(100, g)
        w.set_mean_gradients(w.gradient_sums(), w.visits)
        w.step()
    for (name, a), (_, b) in zip(sender.module.named_parameters(), joiner.module.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_state_of_another_stage_or_an_incomplete_transfer_is_refused():
    other_stage = worker("sender", 0)  # stage 0 holds the embedding and head besides its blocks: another layout
    with pytest.raises(WorkerError, match="do not match"):
        load_state(worker("joiner", 1), transferred(other_stage))
    parts = transferred(stepped(stage=1, steps=1))
    with pytest.raises(WorkerError, match="parts 0 and 1"):
        load_state(worker("joiner", 1), {0: parts[0]})
