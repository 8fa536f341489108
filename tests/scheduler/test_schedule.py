import json

import pytest

from scheduler.path_rules import PathRules
from scheduler.planner import PlanOptions, plan_for_profile
from scheduler.schedule import Route, Schedule, ScheduleError, validate


def small_schedule() -> Schedule:
    placement = {"h0": 0, "h1": 0, "a": 1, "b": 2, "c": 3}
    routes = (Route(0, "h0", (1, 2), ("a", "b")), Route(1, "h1", (3, 2), ("c", "b")),
              Route(2, "h0", (1, 3), ("a", "c")))
    return Schedule(epoch=4, rules=PathRules(4, 3), placement=placement, memory=dict.fromkeys(placement, 3),
                    routes=routes, run_id="run")


def test_json_round_trip():
    s = small_schedule()
    validate(s)
    back = Schedule.from_json(s.to_json())
    assert back == s
    assert back.to_dict() == json.loads(s.to_json())


def test_planned_schedule_round_trips_and_validates():
    s = plan_for_profile("single-cluster", num_peers=8, num_stages=4, skip=0.25, microbatches_per_holder=2,
                         iterations=20)
    validate(s)
    assert Schedule.from_json(s.to_json()).routes == s.routes
    assert s.meta["costs"]["ids"] == sorted(s.placement)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["routes"][0].update(stages=[1, 1]), "microbatch 0, hop 2: stage 1 visited twice"),
    (lambda d: d["routes"][1].update(peers=["c", "a"]), "microbatch 1, hop 2: peer a serves stage 1, not 2"),
    (lambda d: d["routes"][2].update(origin="a"), "microbatch 2, hop 0: origin a is not a stage-0 peer"),
    (lambda d: d["routes"][2].update(microbatch=0), "microbatch 0: id used twice"),
    (lambda d: d["routes"][0].update(peers=["a", "zz"]), "unknown peer zz"),
    (lambda d: d["memory"].update(a=0), "memory slots must be >= 1"),
    (lambda d: d["routes"][0].update(stages=[3, 1], peers=["c", "a"]), "swap distance 2"),
])
def test_validator_names_microbatch_hop_and_rule(mutate, message):
    d = small_schedule().to_dict()
    mutate(d)
    with pytest.raises(ScheduleError, match=message):
        validate(Schedule.from_dict(d))


def test_unbalanced_stages_are_rejected():
    d = small_schedule().to_dict()
    d["routes"].append({"microbatch": 3, "origin": "h1", "stages": [1, 2], "peers": ["a", "b"]})
    d["routes"].append({"microbatch": 4, "origin": "h1", "stages": [1, 2], "peers": ["a", "b"]})
    with pytest.raises(ScheduleError, match="stage balance"):
        validate(Schedule.from_dict(d))


@pytest.mark.parametrize("bad", [
    None, [], {"version": 99}, {"version": 1, "rules": "x"},
    {"version": 1, "epoch": 1.0, "rules": {"num_stages": 4, "stages_per_path": 3, "max_swaps": 2,
                                           "max_swap_distance": 1, "max_jump": 4}, "placement": {}, "memory": {},
     "routes": []},
    {"version": 1, "epoch": 1, "rules": {"num_stages": 4, "stages_per_path": 9, "max_swaps": 2,
                                         "max_swap_distance": 1, "max_jump": 4}, "placement": {}, "memory": {},
     "routes": []},
    {"version": 1, "epoch": 1, "rules": {"num_stages": 4, "stages_per_path": 3, "max_swaps": 2,
                                         "max_swap_distance": 1, "max_jump": 4}, "placement": {"a": "0"},
     "memory": {}, "routes": []},
])
def test_malformed_data_is_refused_with_schedule_error(bad):
    with pytest.raises(ScheduleError):
        Schedule.from_dict(bad)


def test_not_json_is_refused():
    with pytest.raises(ScheduleError, match="not valid JSON"):
        Schedule.from_json("{nope")


def test_plan_options_default_is_collision_aware():
    assert PlanOptions().collision_aware
