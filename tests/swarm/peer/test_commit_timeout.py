"""How long a peer waits for an iteration's commit: two minutes, or four of the schedule's predicted iterations
when those are longer (a 1.5B model's iteration over a WAN takes a minute), capped."""

from __future__ import annotations

import dataclasses

from swarm.peer.iteration_runner import COMMIT_TIMEOUT, MAX_PREDICTED_SECONDS, commit_timeout


def test_the_commit_wait_grows_with_the_predicted_iteration_and_is_capped(schedule):
    quick = dataclasses.replace(schedule, predicted_iteration_seconds=0.5)
    assert commit_timeout(quick) == COMMIT_TIMEOUT
    assert commit_timeout(dataclasses.replace(schedule, predicted_iteration_seconds=None)) == COMMIT_TIMEOUT
    assert commit_timeout(dataclasses.replace(schedule, predicted_iteration_seconds=90.0)) == 360.0
    huge = dataclasses.replace(schedule, predicted_iteration_seconds=1e12)
    assert commit_timeout(huge) == 4 * MAX_PREDICTED_SECONDS
