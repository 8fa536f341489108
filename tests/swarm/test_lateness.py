"""The rule for someone awaited being late against the others (`swarm.lateness`): half must have come, and the
awaited are late past the median arrival by max(3 s, half the median), times a patience."""

from __future__ import annotations

import pytest

from swarm.lateness import LATE_FLOOR, overdue


def test_the_awaited_are_late_once_past_the_median_arrival_by_the_floor_or_half_of_it():
    # two of four came, at 10 and 10.5 s: the median is 10 s, late means more than max(3, 5) = 5 s behind it
    assert overdue([10.0, 10.5], awaited=2, elapsed=14.9) is None
    assert overdue([10.0, 10.5], awaited=2, elapsed=15.5) == pytest.approx(5.5)
    # a short iteration (median 1.1 s): the floor rules
    assert overdue([1.0, 1.2, 1.1], awaited=1, elapsed=1.1 + LATE_FLOOR - 0.1) is None
    assert overdue([1.0, 1.2, 1.1], awaited=1, elapsed=1.1 + LATE_FLOOR + 0.1) is not None
    assert overdue([1.0, 1.2, 1.1], awaited=1, elapsed=1.1 + LATE_FLOOR + 0.1, patience=3.0) is None
    # fewer came than are awaited: a lone fast holder says nothing about the others, however long it has been
    assert overdue([10.0], awaited=3, elapsed=1000.0) is None
    assert overdue([], awaited=0, elapsed=1000.0) is None
