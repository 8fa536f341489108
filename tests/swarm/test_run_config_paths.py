"""A run whose paths cannot visit every stage is refused: peers placed there would never train."""

import pytest

from scheduler.path_rules import PathRules, never_trained_stages, valid_stage_sequences
from swarm.run_config import RunConfig


@pytest.mark.parametrize("stages", range(1, 9))
@pytest.mark.parametrize("skip", [0.0, 0.25, 0.33, 0.5, 0.75, 0.9])
def test_never_trained_stages_are_those_no_valid_path_visits(stages, skip):
    visited = {s for path in valid_stage_sequences(PathRules.from_skip_ratio(stages, skip)) for s in path}
    assert never_trained_stages(stages, skip) == sorted(set(range(1, stages)) - visited)


def test_one_stage_per_path_leaves_stage_1_untrained():
    assert never_trained_stages(2, 0.33) == [1]
    with pytest.raises(ValueError, match=r"no path can visit stage\(s\) 1, whose peers would never train"):
        RunConfig.from_tables({}, stages=2, skip=0.33)


def test_paths_that_reach_every_stage_are_accepted():
    assert RunConfig.from_tables({}, stages=3, skip=0.33).stages == 3
    assert RunConfig.from_tables({}, stages=2, skip=0.0).stages == 2


def test_a_full_pipeline_planner_ignores_the_skip_ratio():
    config = RunConfig.from_tables({"swarm": {"planner": "full-pipeline"}}, stages=2, skip=0.5)
    assert config.planner == "full-pipeline"
