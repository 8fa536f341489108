"""A peer's iteration deadline follows the schedule's prediction, then the measured iteration times."""

from __future__ import annotations

from tests.swarm.coordinator.conftest import make_records, make_replanner


def test_the_iteration_deadline_follows_measured_iteration_times():
    from swarm.peer.peer import MIN_ITERATION_DEADLINE, Peer, PeerOptions

    peer = Peer.__new__(Peer)
    peer.options = PeerOptions(initial_peers=(), identity_path="unused", iteration_deadline=300.0)
    peer.schedule = make_replanner().plan(make_records(), epoch=0, start_iteration=0)
    peer._commit_periods = []
    predicted = peer.schedule.predicted_iteration_seconds
    assert peer.iteration_deadline() == min(300.0, max(MIN_ITERATION_DEADLINE, 5 * predicted))
    peer._commit_periods = [20.0, 21.0, 19.0]
    assert peer.iteration_deadline() == 100.0  # five times the measured median
    peer._commit_periods = [200.0]
    assert peer.iteration_deadline() == 300.0  # never above the configured cap
    peer._commit_periods = [0.5]
    assert peer.iteration_deadline() == MIN_ITERATION_DEADLINE
