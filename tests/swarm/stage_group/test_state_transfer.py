"""A stage's weights and optimizer state, sent as two STATE messages, restore a fresh worker of that stage
exactly; a transfer from another stage's layout, or an incomplete one, is refused with a WorkerError."""

from __future__ import annotations

import time

import pytest
import torch

from peers.checkpoint import stage_tensors
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker, WorkerError
from swarm.net.delivery import Inbound
from swarm.stage_group.state_transfer import load_state, receive_agreed_state, send_state
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


def test_a_large_state_still_coming_in_pieces_is_waited_for_past_the_timeout():
    """A state too large for one message arrives in pieces, which the receiver's inbox counts before the whole
    message is filed: the wait lasts `timeout` past the last piece, not from its start."""
    sender = stepped(stage=1, steps=2)
    parts, arrived, start = transferred(sender), [0], time.monotonic()

    def receive(timeout: float) -> list[Inbound]:
        time.sleep(min(timeout, 0.1))
        elapsed = time.monotonic() - start
        arrived[0] = int(elapsed * 10) if elapsed < 1.5 else arrived[0]  # a piece every 0.1 s, for 1.5 s
        return list(parts.values()) if elapsed >= 1.5 else []

    got = receive_agreed_state(worker("joiner", 1), receive, senders=["sender"], needed=1, timeout=0.5,
                               progress=lambda: arrived[0])
    assert set(got) == {0, 1} and time.monotonic() - start >= 1.5
    start, arrived[0] = time.monotonic(), 0
    with pytest.raises(TimeoutError):  # nothing coming: given up after the timeout
        receive_agreed_state(worker("joiner", 1), lambda t: time.sleep(min(t, 0.1)) or [], senders=["sender"],
                             needed=1, timeout=0.5, progress=lambda: 0)
