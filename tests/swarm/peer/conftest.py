"""Fixtures of the peer's tests: a schedule planned by the real scheduler, a scheduler's identity."""

from __future__ import annotations

import pytest

from swarm.coordinator.actions import PublishSchedule
from swarm.net.identity import ensure_identity, load_identity
from tests.swarm.coordinator.conftest import make_records, make_scheduler


@pytest.fixture(scope="module")
def schedule():
    """The first epoch the scheduler publishes for the coordinator tests' peers."""
    s, records = make_scheduler(), make_records()
    fresh = {p: (r, 0.5) for p, r in records.items()}
    s.observe(fresh, 0.0)
    (action,) = [a for a in s.observe(fresh, 60.0) if isinstance(a, PublishSchedule)]
    return action.schedule


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """The identity of the scheduler whose certificates and notices the tests' peer takes."""
    path = str(tmp_path_factory.mktemp("keys") / "scheduler.key")
    ensure_identity(path)
    return load_identity(path)
