"""A paced worker lasts as long as the stated device and computes exactly what the plain worker computes."""

import time

import pytest
import torch
from peers_util import MICRO

from peers.optim import OptimConfig
from peers.paced_worker import PacedWorker
from peers.worker import StageWorker, WorkerError
from scheduler.constants import BACKWARD_FACTOR, LOSS_FACTOR

SPLIT = (2, 1, 1)
SPL = 0.1
SLACK = 0.25
"""Seconds a loaded 2-core machine may add to a sleep."""


def timed(fn, *args, **kw):
    start = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - start


def test_operations_last_as_long_as_the_emulated_device_and_match_the_plain_worker():
    tokens = torch.randint(0, MICRO.vocab_size, (2, 9))
    plain = StageWorker("p", 0, MICRO, SPLIT, OptimConfig(grad_clip=0))
    paced = PacedWorker("p", 0, MICRO, SPLIT, OptimConfig(grad_clip=0), seconds_per_layer=SPL)
    forward = SPL * SPLIT[0]  # stage 0 has 2 layers
    out, t_inject = timed(paced.inject, 0, tokens)
    assert torch.equal(out, plain.inject(0, tokens))
    (loss, grad), t_loss = timed(paced.loss, 0, out)
    plain_loss, plain_grad = plain.loss(0, out)
    assert loss == plain_loss and torch.equal(grad, plain_grad)
    _, t_backward = timed(paced.backward, 0, grad)
    for elapsed, expected in ((t_inject, forward), (t_loss, LOSS_FACTOR * forward),
                              (t_backward, BACKWARD_FACTOR * forward)):
        assert expected <= elapsed < expected + SLACK
    plain.backward(0, plain_grad)
    for (name, a), (_, b) in zip(paced.module.named_parameters(), plain.module.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


def test_stage_forward_uses_its_own_layer_count():
    w = PacedWorker("p", 2, MICRO, SPLIT, OptimConfig(), seconds_per_layer=SPL)
    _, elapsed = timed(w.forward, 0, torch.randn(2, 8, MICRO.dim))
    assert SPL * SPLIT[2] <= elapsed < SPL * SPLIT[2] + SLACK


def test_a_speed_faster_than_this_machine_is_counted_as_an_overrun():
    w = PacedWorker("p", 1, MICRO, SPLIT, OptimConfig(), seconds_per_layer=1e-9)
    w.forward(0, torch.randn(2, 8, MICRO.dim))
    assert w.overruns == 1


def test_refused_operations_are_not_padded_and_bad_speeds_are_refused():
    w = PacedWorker("p", 1, MICRO, SPLIT, OptimConfig(), seconds_per_layer=1.0)
    start = time.perf_counter()
    with pytest.raises(WorkerError):
        w.backward(99, torch.zeros(2, 8, MICRO.dim))
    assert time.perf_counter() - start < 0.5
    for bad in (0, -1, float("nan"), float("inf"), "fast"):
        with pytest.raises(ValueError, match="seconds_per_layer"):
            PacedWorker("p", 1, MICRO, SPLIT, OptimConfig(), seconds_per_layer=bad)
