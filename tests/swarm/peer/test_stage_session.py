"""StageSession with hivemind averaging: a member that stepped without a whole round says so at its next round, and
the group then averages its whole state, so the copies of the stage agree again; a member the commit left out
contributes nothing and installs its group's mean (two real processes each)."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import hivemind
import pytest

from swarm.net.dht_shutdown import stop_dht
from tests.utils.processes import join_or_stop, spawn
from tests.utils.swarm_workers import left_out_session_peer, session_peer

pytestmark = pytest.mark.timeout(120)


def run_two_members(target: Callable[..., None], args: Callable[[int, list[str], Any], tuple]) -> dict[int, Any]:
    """`target(*args(i, DHT addresses, answer queue))` for members 0 and 1 in processes of their own, over a fresh
    hivemind DHT; their answers by index."""
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    try:
        res_q = mp.get_context("spawn").Queue()
        maddrs = [str(m) for m in dht.get_visible_maddrs()]
        procs = [spawn(target, *args(i, maddrs, res_q)) for i in range(2)]
        try:
            return dict(res_q.get(timeout=100) for _ in range(2))
        finally:
            for p in procs:
                join_or_stop(p, timeout=20)
    finally:
        stop_dht(dht)


def test_a_member_that_stepped_alone_is_resynced_with_its_group_at_the_next_round():
    barrier = mp.get_context("spawn").Barrier(2)
    results = run_two_members(session_peer, lambda i, maddrs, res_q: (i, maddrs, barrier, res_q, i == 0))
    (alone_digest, alone_drifted, _), (alone_after, alone_drifted_after, alone_resynced) = results[0]
    (mate_digest, mate_drifted, _), (mate_after, mate_drifted_after, mate_resynced) = results[1]
    assert alone_drifted and not mate_drifted, results  # it looked for its group and stepped on its own gradient
    assert alone_digest != mate_digest
    assert alone_resynced and mate_resynced, results  # its flag in the next round asked both for their whole state
    assert alone_after == mate_after  # weights and AdamW moments agree again, bit for bit
    assert not alone_drifted_after and not mate_drifted_after


def test_a_member_the_commit_left_out_contributes_nothing_and_installs_its_groups_mean():
    results = run_two_members(left_out_session_peer, lambda i, maddrs, res_q: (i, maddrs, res_q, i == 1))
    (counted_own, counted_installed, counted_round), (_, left_installed, left_round) = results[0], results[1]
    # the round weighs the counted member's one microbatch only, and both members install its mean gradient
    assert counted_round == left_round == (1, 2), results
    assert counted_installed == pytest.approx(counted_own, rel=1e-5, abs=1e-7)
    assert left_installed == pytest.approx(counted_own, rel=1e-5, abs=1e-7)
