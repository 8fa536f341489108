"""What a peer announces of its speed: an emulated device's seconds per layer as given, a loss step measured here
(never less than the emulation's floor); measured in a thread of its own, its errors handed to the caller."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from peers.device_speed import announced_speed, announced_speed_meanwhile
from peers.model import ModelConfig
from scheduler.constants import LOSS_FACTOR

MODEL = ModelConfig(vocab_size=128, dim=32, n_layers=4, n_heads=2, max_seq_len=16)

EXITS_MEANWHILE = """
import sys, time
import torch
torch.set_num_threads(1)
from peers.device_speed import announced_speed_meanwhile
from peers.model import ModelConfig
model = ModelConfig(vocab_size=4096, dim=256, n_layers=4, n_heads=4, ffn_dim=704, max_seq_len=128)
announced_speed_meanwhile(model, 8, 128, "cpu", stages=2)
time.sleep(float(sys.argv[1]))
sys.exit(2)  # a joiner that refuses the run before it takes the measurement
"""


def test_an_emulated_device_announces_its_layer_time_and_a_loss_step_no_faster_than_this_machine():
    per_layer, loss = announced_speed(MODEL, 2, 16, "cpu", stages=2, emulate_seconds_per_layer=0.5)
    assert per_layer == 0.5 and loss >= LOSS_FACTOR * 0.5 * 2  # the first stage's 2 layers
    measured, measured_loss = announced_speed(MODEL, 2, 16, "cpu", stages=2)
    assert 0 < measured < 1 and 0 < measured_loss < 1


def test_measured_meanwhile_the_caller_goes_on_and_takes_the_result_or_the_error():
    future = announced_speed_meanwhile(MODEL, 2, 16, "cpu", stages=2, emulate_seconds_per_layer=0.5)
    assert any(t.name == "skippipe-speed" for t in threading.enumerate()) or future.done()
    per_layer, loss = future.result(timeout=60)
    assert per_layer == 0.5 and loss >= LOSS_FACTOR * 0.5 * 2
    failing = announced_speed_meanwhile(MODEL, 2, 16, "no-such-device", stages=2)
    with pytest.raises(RuntimeError):
        failing.result(timeout=60)


@pytest.mark.timeout(120)
def test_a_process_that_exits_while_it_measures_exits_with_its_own_code():
    """The measurement is not a daemon thread: torch's kernels running while the interpreter is torn down abort the
    process ("terminate called without an active exception", exit -6: a relayed joiner refusing a run did, on CI)."""
    root = Path(__file__).resolve().parents[2]
    for delay in ("0.1", "0.3", "0.6"):  # mid-measurement, whichever pass it is in
        done = subprocess.run([sys.executable, "-c", EXITS_MEANWHILE, delay], cwd=root, capture_output=True, text=True,
                              timeout=100)
        assert done.returncode == 2 and "terminate called" not in done.stderr, (delay, done.returncode, done.stderr)
