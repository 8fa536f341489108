"""Churn: peers die (kill -9, whole machine) and join mid-run; the run finishes and no sample is lost or doubled.

A local swarm of 8 peers (4 data holders, stage groups of 2) trains; a relay is killed mid-iteration (forwards to
it are detoured to its stage mate in flight), a new peer joins, a data holder is killed, another peer joins (and
becomes a data holder), then the coordinator is killed and a peer takes over as scheduler. Every data holder keeps a
ledger on disk; together they must show every sample that was handed out processed exactly once (a dead holder's
shard is taken over by another holder, then by the joiner; or at once by a peer moved to stage 0).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from peers.data_ledger import committed, read_ledger, sample_status
from swarm.local.local_swarm import LocalSwarm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ITERATIONS = 36  # the scenario's last step (the takeover) comes at ~21-25 here; the rest shows the run finish
PEERS = 8


def wait_iteration(swarm: LocalSwarm, n: int, timeout: float = 180) -> None:
    swarm.watch(n, timeout=timeout)


def wait_placed(swarm: LocalSwarm, index: int, timeout: float = 180) -> None:
    """Until the joining peer `index` has loaded its stage's state from a same-stage peer."""
    end = time.monotonic() + timeout
    while not loaded_from_a_peer(swarm, index):
        assert time.monotonic() < end, f"peer {index} was not placed"
        time.sleep(0.5)


def loaded_from_a_peer(swarm: LocalSwarm, index: int) -> bool:
    return any(e["source"] == "peer" for e in swarm.events("stage_loaded", who=f"peer-{index:02d}"))


def placement(swarm: LocalSwarm) -> dict[str, int]:
    return swarm.schedule()["placement"]


def peer_id(swarm: LocalSwarm, index: int) -> str:
    from swarm.net.identity import ensure_identity

    return ensure_identity(str(swarm.run_dir / f"peer-{index:02d}.key"))


def test_run_survives_deaths_and_joins_without_losing_or_doubling_samples(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f"[run]\nrun_id = 'churn'\nstages = 3\nskip = 0.33\nmicrobatches = 1\n"
                      f"iterations = {ITERATIONS}\nmin_peers = {PEERS}\n[swarm]\nheartbeat = 1.0\n")
    run_dir = tmp_path / "run"

    def args(i: int) -> list[str]:
        return ["--iteration-deadline", "90", "--ledger", str(run_dir / f"ledger-{i:02d}.jsonl")]

    swarm = LocalSwarm(run_dir, PEERS, run_id="churn", coordinator_args=["--config", str(config)],
                       peer_args=[args(i) for i in range(PEERS)])
    try:
        swarm.start()
        wait_iteration(swarm, 3)
        ids = {peer_id(swarm, i): i for i in range(PEERS)}
        where = placement(swarm)
        busy = {p for r in swarm.schedule()["routes"] for p in r["peers"]}  # relays the paths go through
        relay = next(i for pid, i in ids.items() if pid in busy and list(where.values()).count(where[pid]) > 1)
        swarm.kill(swarm.peers[relay])  # mid-iteration: the run is iterating continuously
        wait_iteration(swarm, 5)
        swarm.add_peer(PEERS, args(PEERS))
        wait_placed(swarm, PEERS)
        holder = next(i for pid, i in ids.items() if where[pid] == 0)
        swarm.kill(swarm.peers[holder])
        wait_iteration(swarm, len(swarm.metrics()) + 2)
        swarm.add_peer(PEERS + 1, args(PEERS + 1))
        wait_placed(swarm, PEERS + 1)
        assert len(swarm.metrics()) < ITERATIONS - 8, "the scenario took most of the run: raise ITERATIONS"
        swarm.kill(swarm.coordinator)  # a peer must take over planning, signing and committing
        records = swarm.watch(ITERATIONS, timeout=240)
        for i, proc in enumerate(swarm.peers):
            if i not in (relay, holder):
                proc.wait(timeout=90)  # every survivor finishes the run and leaves by itself
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    assert records[-1]["loss"] < records[0]["loss"]
    epochs = [r["epoch"] for r in records]
    assert epochs[-1] >= 5, epochs  # two departures, two joins and a new scheduler, each a new epoch
    coordinator = swarm.events(who="coordinator")[0]["node"]
    assert [e["previous"] for e in swarm.events("scheduler_changed", who="peer-*")][:1] == [coordinator]
    # the dead relay's work was handled in flight: forwards to it went to its stage mate, or a microbatch whose
    # activations it held was reported broken and re-queued by its holder (which one depends on where the
    # kill caught the microbatches; tests/swarm/peer/test_pipeline_detours.py covers each deterministically)
    dead_relay = peer_id(swarm, relay)
    assert any(e["gone"] == dead_relay for e in swarm.events("detoured")) or swarm.events("microbatch_broken")
    assert {e["peer"] for e in swarm.events("joiner_placed")} >= {peer_id(swarm, i) for i in (PEERS, PEERS + 1)}
    assert all(loaded_from_a_peer(swarm, i) for i in (PEERS, PEERS + 1))

    entries = []
    for f in sorted(run_dir.glob("ledger-*.jsonl")):
        entries += read_ledger(f)
    status = sample_status(entries, committed(records))  # the scheduler's commits: the ground truth
    assert status, "no data holder kept a ledger"
    processed = Counter(c["processed"] for c in status.values())
    assert set(processed) == {1}, f"samples processed {dict(processed)} times"  # none lost, none doubled
    assert any(c["requeued"] or c["pending"] for c in status.values())  # churn really hit in-flight samples
    shards = {e["shard"] for e in entries if e["event"] == "draw"}
    assert len(shards) == 4
    dead = peer_id(swarm, holder)
    dead_shards = {e["shard"] for e in entries if e["event"] == "draw" and e["holder"] == dead}
    takers = {e["holder"] for e in entries if e["event"] == "draw" and e["shard"] in dead_shards}
    # the dead holder's shard was taken over at its committed position (the ledgers above show no sample twice):
    # by a peer moved to stage 0 at once when that made the iteration >= 10% shorter (rebalancing), else carried by
    # a surviving holder, then handed to the second joiner, placed as a data holder to restore their number
    shard_moves = swarm.events("shard_moved")
    assert any(e["source"] == dead for e in shard_moves), shard_moves
    if any(e["why"] == "rebalance" and e["to_stage"] == 0 for e in swarm.events("peer_moved")):
        assert len(takers) == 2 and dead in takers, takers
    else:
        joiner = peer_id(swarm, PEERS + 1)
        assert len(takers) == 3 and joiner in takers, takers
        assert any(e["to"] == joiner and e["source"] in takers for e in shard_moves), shard_moves
