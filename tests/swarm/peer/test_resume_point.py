"""Where a peer taking the scheduler role over resumes the run (`resume_point`)."""

from __future__ import annotations

from swarm.peer.succession import resume_point

POSITIONS = {"0": {"holder": 0, "num_holders": 2, "epoch": 0, "cursor": 40}}


def test_a_peer_still_stepping_a_committed_iteration_resumes_after_it():
    # the commit of iteration 18 arrived; this peer is still averaging it (its iteration is 18): the others are at
    # 19, and a rerun of 18 would wait for their reports of it for ever
    assert resume_point(18, (18, POSITIONS)) == (19, POSITIONS)


def test_a_peer_at_the_iteration_after_the_last_commit_resumes_there_with_its_positions():
    assert resume_point(19, (18, POSITIONS)) == (19, POSITIONS)


def test_positions_of_an_older_commit_are_not_used():
    # a joiner placed at 19 never heard the commit of 18: the newest epoch's positions hold
    assert resume_point(19, (-1, {})) == (19, None)
    assert resume_point(21, (18, POSITIONS)) == (21, None)
