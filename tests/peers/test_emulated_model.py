"""What an emulated preset sends and computes per microbatch (`peers.emulated_model`)."""

from __future__ import annotations

import pytest

from peers.emulated_model import message_bytes, stage_time_scale

MIB = 1024 * 1024


def test_message_bytes_follow_the_preset():
    assert message_bytes("1.5b") == 2048 * 4096 * 2 == 16 * MIB  # the paper's 1.5B: one 4096-token sequence, bf16
    assert message_bytes("500m") == 1024 * 1024 * 2
    assert message_bytes("1.5b", tokens=2048, dtype_bytes=4) == 16 * MIB
    assert message_bytes("tiny", tokens=4 * 32, dtype_bytes=4) == 64 * 1024  # the WAN benchmark's old message


def test_stage_time_scales_with_the_preset_s_flops_and_layers_per_stage():
    # the reference: a 500m stage of 4 layers on 8 x 1024 tokens is 4 reference layers
    assert stage_time_scale("500m", 6, tokens=8 * 1024) == pytest.approx(4.0)
    assert stage_time_scale("500m", 3, tokens=8 * 1024) == pytest.approx(8.0)
    assert stage_time_scale("500m", 6) == pytest.approx(0.5)  # one 1024-token sequence: an eighth
    big = stage_time_scale("1.5b", 6)
    assert 6 < big < 8  # 4 layers of ~3.2x the parameters, on half the tokens, with 4x the context


@pytest.mark.parametrize("call", [lambda: message_bytes("2b"), lambda: message_bytes("1.5b", tokens=0),
                                  lambda: message_bytes("1.5b", dtype_bytes=3),
                                  lambda: stage_time_scale("1.5b", 0), lambda: stage_time_scale("1.5b", 25),
                                  lambda: stage_time_scale("tiny", 6, tokens=-5)])
def test_bad_values_are_refused(call):
    with pytest.raises(ValueError):
        call()
