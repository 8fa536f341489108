"""Stage-group averaging across 3 real processes gives the mean weighted by microbatches processed."""

from __future__ import annotations

import multiprocessing as mp

import hivemind
import pytest
import torch

from swarm.net.dht_shutdown import stop_dht
from swarm.stage_group.hivemind_averager import StageAverager
from tests.utils.processes import join_or_stop, spawn
from tests.utils.swarm_workers import averaging_peer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def bootstrap():
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    try:
        yield dht
    finally:
        stop_dht(dht)


def test_weighted_mean_across_three_processes(bootstrap):
    ctx = mp.get_context("spawn")
    barrier, res_q = ctx.Barrier(3), ctx.Queue()
    maddrs = [str(m) for m in bootstrap.get_visible_maddrs()]
    # peer i processed w microbatches whose mean gradient is v: (v, w) per round
    rounds = {0: [(1.0, 1), (5.0, 2)], 1: [(2.0, 2), (5.0, 2)], 2: [(4.0, 5), (-1.0, 0)]}
    procs = [spawn(averaging_peer, i, maddrs, barrier, res_q, rounds[i]) for i in range(3)]
    try:
        results = dict(res_q.get(timeout=100) for _ in range(3))
    finally:
        for p in procs:
            join_or_stop(p, timeout=20)
    expected = [(1 * 1 + 2 * 2 + 4 * 5) / 8, (5 * 2 + 5 * 2 + -1 * 0) / 4]  # sum(w v) / sum(w), not mean(v)
    for i in range(3):
        for r, (result, values, _) in enumerate(results[i]):
            total = sum(rounds[j][r][1] for j in range(3))
            assert result.averaged and result.group_size == 3 and result.total_weight == total
            assert values == pytest.approx([expected[r]] * 3, rel=1e-6), (i, r)


def test_lone_peer_keeps_its_tensors_after_the_deadline(bootstrap):
    grads = [torch.full((5,), 3.0)]
    averager = StageAverager(bootstrap, run_id="run-alone", stage=2, tensors=grads, min_matchmaking_time=0.5)
    try:
        result = averager.average(grads, 4, timeout=2.0)
    finally:
        averager.shutdown()
    assert not result.averaged and result.group_size == 1
    assert torch.equal(grads[0], torch.full((5,), 3.0))
