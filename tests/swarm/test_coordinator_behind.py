"""A coordinator away past its record's lifetime (its whole host frozen: SIGSTOP on it, its DHT process, p2pd and
gossip sidecar) is succeeded: a peer takes the scheduler role over and commits on. Thawed, the coordinator is behind
its successor; the peers do not follow it again, and it must not compete (plan, announce, commit): it stands down
once most of its peers report iterations past its own, and leaves when the run is over. The run completes under the
successor, every sample processed once.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from peers.data_ledger import committed, read_ledger, sample_status
from swarm.local.local_swarm import LocalSwarm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PEERS = 6
ITERATIONS = 24
SUCCESSOR_COMMITS = 2
"""Iterations the successor commits while the coordinator is frozen."""
COMPETING = {"replanned", "joiner_placed", "declared_gone", "holders_excused", "peer_moved", "shard_moved",
             "taken_back"}
"""What a scheduler at work does, which a coordinator that stood down must not."""


def test_a_coordinator_thawed_behind_its_successor_stands_down_and_the_run_completes(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f"[run]\nrun_id = 'behind'\nstages = 3\nskip = 0.33\nmicrobatches = 2\n"
                      f"iterations = {ITERATIONS}\nmin_peers = {PEERS}\nseed = 0\n[swarm]\nheartbeat = 1.0\n")
    run_dir = tmp_path / "run"
    swarm = LocalSwarm(run_dir, PEERS, run_id="behind", coordinator_args=["--config", str(config)],
                       peer_args=[["--iteration-deadline", "120", "--ledger", str(run_dir / f"ledger-{i:02d}.jsonl")]
                                  for i in range(PEERS)])
    try:
        swarm.start()
        swarm.watch(3, timeout=180)
        tree = swarm.freeze(swarm.coordinator)
        try:
            end = time.monotonic() + 120
            while not (changed := swarm.events("scheduler_changed", who="peer-*")) or \
                    len([r for r in swarm.metrics() if r["time"] > changed[0]["time"]]) < SUCCESSOR_COMMITS:
                assert time.monotonic() < end, "no successor committed while the coordinator was frozen"
                time.sleep(0.5)
        finally:
            for p in tree:
                p.resume()
        thawed = time.time()
        records = swarm.watch(ITERATIONS, timeout=240)
        for proc in swarm.peers:
            assert proc.wait(timeout=120) == 0  # the successor finished the run, and every peer left
        assert swarm.coordinator.wait(timeout=60) == 0  # it heard the run end, and left by itself
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    (down,) = swarm.events("scheduler_stood_down", who="coordinator")
    assert down["time"] > thawed and down["iteration"] < len(records)
    after = {e["event"] for e in swarm.events(who="coordinator") if e["time"] > thawed}
    assert not after & COMPETING, after
    # the peers never followed it again: the last change of scheduler is to the successor
    successor = changed[0]["scheduler"]
    assert all(e["scheduler"] == successor for e in swarm.events("scheduler_changed", who="peer-*")
               if e["time"] > thawed)
    entries = [e for f in sorted(run_dir.glob("ledger-*.jsonl")) for e in read_ledger(f)]
    status = sample_status(entries, committed(records))
    processed = Counter(c["processed"] for c in status.values())
    assert status and set(processed) == {1}, f"samples processed {dict(processed)} times"
