"""The [train] table of a run config: precision, recomputation, loss scale; as data, through the signed spec."""

import pytest

from swarm.run_config import RunConfig


def test_defaults_recompute_only_the_large_flavors():
    assert not RunConfig.from_tables({}).recompute
    assert not RunConfig.from_tables({"run": {"model": "small"}}).recompute
    assert RunConfig.from_tables({"run": {"model": "500m", "stages": 6}}).recompute
    assert RunConfig.from_tables({"run": {"model": "1.5b", "stages": 6}}).recompute
    assert RunConfig.from_tables({"run": {"model": "tiny"}, "train": {"recompute": "blocks"}}).recompute
    assert not RunConfig.from_tables({"run": {"model": "1.5b"}, "train": {"recompute": "none"}}).recompute


def test_only_an_fp16_run_scales_its_loss():
    assert RunConfig.from_tables({}).loss_scale == 1.0
    assert RunConfig.from_tables({"train": {"precision": "bf16", "loss_scale": 4096}}).loss_scale == 1.0
    assert RunConfig.from_tables({"train": {"precision": "fp16"}}).loss_scale == 1024.0
    assert RunConfig.from_tables({"train": {"precision": "fp16", "loss_scale": 65536}}).loss_scale == 65536.0


@pytest.mark.parametrize("table, message", [
    ({"recompute": "some"}, "train.recompute must be one of auto, blocks, none"),
    ({"precision": "fp64"}, "train.precision must be one of auto, fp32, bf16, fp16"),
    ({"loss_scale": 1000}, "train.loss_scale must be a power of two"),
    ({"precison": "fp32"}, "unknown field"),
])
def test_bad_train_fields_are_refused_by_name(table, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_tables({"train": table})


def test_train_must_be_a_table():
    with pytest.raises(ValueError, match=r"\[train\] must be a table"):
        RunConfig.from_tables({"train": "fast"})


def test_fused_adamw_is_an_optim_field():
    assert RunConfig.from_tables({"optim": {"fused": True}}).optim.fused
    with pytest.raises(ValueError, match="optim.fused must be true or false"):
        RunConfig.from_tables({"optim": {"fused": 1}})


def test_train_travels_in_the_run_spec():
    cfg = RunConfig.from_tables({"train": {"precision": "fp16", "recompute": "blocks", "loss_scale": 2048}})
    back, _ = RunConfig.from_spec(cfg.to_spec(coordinator="c", vocab_size=512))
    assert back.train == cfg.train and back.recompute and back.loss_scale == 2048.0
