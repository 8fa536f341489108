"""A successor's record of an iteration supersedes the dead scheduler's record of it (written, never announced)."""

from swarm.local.local_swarm import committed_records


def test_a_rerun_iteration_replaces_the_records_it_supersedes():
    written = [{"iteration": 36, "epoch": 3}, {"iteration": 37, "epoch": 4}, {"iteration": 37, "epoch": 5},
               {"iteration": 38, "epoch": 5}]
    assert committed_records(written) == [{"iteration": 36, "epoch": 3}, {"iteration": 37, "epoch": 5},
                                          {"iteration": 38, "epoch": 5}]
    in_order = [{"iteration": i, "epoch": 0} for i in range(1, 5)]
    assert committed_records(in_order) == in_order
