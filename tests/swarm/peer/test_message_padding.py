"""Emulated message sizes (`swarm.message_bytes`): the run's wire shape, the padding a peer adds and strips, and
the bytes the planner costs, all from one config; bad values are refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peers.data import DataConfig
from peers.emulated_model import message_bytes
from peers.model import FLAVORS
from swarm.coordinator.replanner import Replanner
from swarm.peer.message_padding import MessagePadding
from swarm.run_config import MAX_MESSAGE_BYTES, RunConfig
from tests.swarm.coordinator.conftest import make_records

MIB = 1024 * 1024
TINY = FLAVORS["tiny"].dim


def config(**kwargs) -> RunConfig:
    cfg = RunConfig(run_id="pad", model="tiny", stages=6, skip=0.33, data=DataConfig(seq_len=32, batch_size=4),
                    **kwargs)
    cfg.validate()
    return cfg


def test_the_wire_shape_pads_the_batch_to_the_emulated_model_s_message():
    cfg = config(message_bytes=message_bytes("1.5b"))  # 2048 x 4096 tokens x 2 bytes
    assert message_bytes("1.5b") == 16 * MIB
    assert cfg.wire_activation_shape(TINY) == (1024, 32, TINY)  # 16 MiB / (32 x 128 x 4 bytes) rows
    assert cfg.message_size(TINY) == 16 * MIB
    # a size between rows rounds up; one below the real message leaves it as it is
    assert config(message_bytes=16 * MIB + 1).wire_activation_shape(TINY)[0] == 1025
    assert config(message_bytes=1000).wire_activation_shape(TINY) == (4, 32, TINY)
    assert config().message_size(TINY) == 4 * 32 * TINY * 4
    # half precision on the wire: twice the rows for the same bytes
    assert config(message_bytes=16 * MIB, wire_dtype="bfloat16").wire_activation_shape(TINY)[0] == 2048


def test_the_planner_costs_the_padded_message():
    cfg = dataclasses.replace(config(), message_bytes=16 * MIB, model="small", stages=6)
    model = cfg.to_spec(coordinator="c", vocab_size=8192).model
    cost = Replanner(cfg, model).model_cost(make_records())
    assert cost.activation_bytes == cfg.message_size(model["dim"]) >= 16 * MIB


@pytest.mark.parametrize("bad", [-1, MAX_MESSAGE_BYTES + 1, 1.5, True, "16MiB"])
def test_bad_message_bytes_are_refused(bad):
    with pytest.raises(ValueError, match="message_bytes"):
        config(message_bytes=bad)
    with pytest.raises(ValueError, match="message_bytes"):
        RunConfig.from_tables({"run": {"model": "tiny"}, "swarm": {"message_bytes": bad}})


def test_the_run_spec_carries_message_bytes_to_the_peers():
    cfg = config(message_bytes=5 * MIB)
    again, model = RunConfig.from_spec(cfg.to_spec(coordinator="c", vocab_size=4096))
    assert again.message_bytes == 5 * MIB and again.wire_activation_shape(model.dim) == cfg.wire_activation_shape(TINY)
    spec = config().to_spec(coordinator="c", vocab_size=4096)
    assert "message_bytes" not in spec.hyperparameters  # unpadded runs publish the spec they always did
    hostile = dataclasses.replace(cfg.to_spec(coordinator="c", vocab_size=4096),
                                  hyperparameters={**spec.hyperparameters, "message_bytes": 1 << 40})
    with pytest.raises(ValueError, match="message_bytes"):
        RunConfig.from_spec(hostile)


def test_padding_round_trips_the_real_rows():
    padding = MessagePadding(4, 16)
    x = torch.randn(4, 3, 5)
    wire = padding.pad(x)
    assert wire.shape == (16, 3, 5) and torch.equal(wire[:4], x) and not wire[4:].any()
    back = padding.strip(wire)
    assert torch.equal(back, x) and back.untyped_storage().nbytes() == x.untyped_storage().nbytes()


def test_padding_refuses_tensors_of_other_shapes_and_bad_sizes():
    padding = MessagePadding(4, 16)
    with pytest.raises(ValueError, match="rows"):
        padding.pad(torch.zeros(5, 3))
    with pytest.raises(ValueError, match="padded rows"):
        padding.strip(torch.zeros(4, 3))
    for rows, wire_rows in ((0, 4), (5, 4), (2.0, 4), (2, None)):
        with pytest.raises(ValueError, match="padding"):
            MessagePadding(rows, wire_rows)
