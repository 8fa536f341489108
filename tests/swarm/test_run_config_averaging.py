"""The stage averaging's fields of a run config ([swarm] averaging, average_dtype): checked, and carried by the
signed spec."""

import pytest

from swarm.run_config import RunConfig


def test_average_dtype_travels_in_the_run_spec_only_when_set():
    plain = RunConfig.from_tables({})
    assert plain.average_dtype == "float32"
    assert "average_dtype" not in plain.to_spec(coordinator="c", vocab_size=512).hyperparameters
    cfg = RunConfig.from_tables({"swarm": {"average_dtype": "bfloat16"}})
    back, _ = RunConfig.from_spec(cfg.to_spec(coordinator="c", vocab_size=512))
    assert back.average_dtype == "bfloat16"


@pytest.mark.parametrize("value", ["float16", "int8", 16, None])
def test_other_average_dtypes_are_refused(value):
    with pytest.raises(ValueError, match="swarm.average_dtype must be float32 or bfloat16"):
        RunConfig.from_tables({"swarm": {"average_dtype": value}})


def test_averaging_by_parts_travels_in_the_run_spec():
    cfg = RunConfig.from_tables({"swarm": {"averaging": "parts"}})
    assert RunConfig.from_spec(cfg.to_spec(coordinator="c", vocab_size=512))[0].averaging == "parts"
    with pytest.raises(ValueError, match="swarm.averaging must be allgather, parts or hivemind"):
        RunConfig.from_tables({"swarm": {"averaging": "butterfly"}})
