"""A departure that leaves a stage group the swarm's bottleneck is bought back by moving a survivor there: a data
holder dies, the other holder would carry its shard (twice the injections and loss steps) until a volunteer
joins; instead a peer of the over-provisioned stage 1 moves to stage 0, takes stage 0's state over from the
surviving holder and the dead holder's shard at its committed position. A full pipeline cannot skip a stage that
lost every peer: a survivor moves there at once and restarts it from a neighbouring stage's blocks. The run goes
on, and no sample is lost or doubled."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from peers.data_ledger import committed, read_ledger, sample_status
from swarm.local.local_swarm import LocalSwarm
from swarm.net.identity import ensure_identity
from swarm.report.write import write_report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ITERATIONS = 14  # the kill comes after iteration 4 and the move is planned at once: ~10 iterations after it
PINS = ["0", "0", "1", "1", "1", "2"]  # stage 1 has a peer to spare


def run_and_kill(tmp_path, planner: str, victim: int) -> tuple[LocalSwarm, list[dict]]:
    """The pinned swarm trains; `victim` is killed after 4 iterations; the run goes on to its end."""
    config = tmp_path / "run.toml"
    config.write_text(f"[run]\nrun_id = 'rebalance'\nstages = 3\nskip = 0\nmicrobatches = 2\n"
                      f"iterations = {ITERATIONS}\nmin_peers = {len(PINS)}\n[swarm]\nheartbeat = 1.0\n"
                      f"planner = '{planner}'\n")
    run_dir = tmp_path / "run"
    # compute emulated at a fixed speed, so that the planned gain of a move does not hang on this machine's load
    args = [["--stage", s, "--iteration-deadline", "90", "--ledger", str(run_dir / f"ledger-{i:02d}.jsonl"),
             "--emulate-speed", "0.03", "--trace", str(run_dir / f"peer-{i:02d}.trace.jsonl")]
            for i, s in enumerate(PINS)]
    swarm = LocalSwarm(run_dir, len(PINS), run_id="rebalance", coordinator_args=["--config", str(config)],
                       peer_args=args)
    try:
        swarm.start()
        swarm.watch(4, timeout=180)
        swarm.kill(swarm.peers[victim])
        records = swarm.watch(ITERATIONS, timeout=300)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    assert records[-1]["loss"] < records[0]["loss"]
    entries = [e for f in sorted(run_dir.glob("ledger-*.jsonl")) for e in read_ledger(f)]
    status = sample_status(entries, committed(records))
    processed = Counter(c["processed"] for c in status.values())
    assert status and set(processed) == {1}, f"samples processed {dict(processed)} times"
    return swarm, records


def test_a_survivor_moves_to_stage_0_when_a_data_holder_dies(tmp_path):
    swarm, records = run_and_kill(tmp_path, "skippipe", victim=1)  # a data holder
    run_dir = swarm.run_dir
    moves = [e for e in swarm.events("peer_moved", who="coordinator") if e["why"] == "rebalance"]
    assert [(e["from_stage"], e["to_stage"]) for e in moves] == [(1, 0)], moves
    movers = [i for i in (2, 3, 4) if any(e["source"] == "handover" and e["stage"] == 0
                                          for e in swarm.events("stage_loaded", who=f"peer-{i:02d}"))]
    assert len(movers) == 1, "one stage 1 peer should have moved to stage 0"
    mover = ensure_identity(str(run_dir / f"peer-{movers[0]:02d}.key"))
    assert moves[0]["peer"] == mover
    final = swarm.schedule()
    assert final["placement"][mover] == 0 and len(final["meta"]["shards"][mover]) == 1
    entries = [e for f in sorted(run_dir.glob("ledger-*.jsonl")) for e in read_ledger(f)]
    assert any(e["holder"] == mover for e in entries if e["event"] == "draw")  # it injects the shard it took
    report = write_report(run_dir)  # `skippipe report` of this finished run, a death and a re-plan in it
    assert [p.name for p in report.plots] == ["loss.png", "tokens_per_s.png", "iteration_time.png", "busy_idle.png",
                                              "gantt_measured.png", "gantt_planned.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in report.plots)
    assert all("peer-01" in w for w in report.warnings), report.warnings  # at most the killed peer's torn line
    page = report.page.read_text()
    assert re.search(r"<td>peers declared gone</td><td>[^<]*peer-01", page) and "re-plan" in page


def test_a_full_pipeline_refills_a_stage_that_lost_every_peer_at_once(tmp_path):
    swarm, records = run_and_kill(tmp_path, "full-pipeline", victim=5)  # stage 2's only peer
    run_dir = swarm.run_dir
    refills = [e for e in swarm.events("peer_moved", who="coordinator") if e["why"] == "refill"]
    assert [e["to_stage"] for e in refills] == [2] and not swarm.events("stage_emptied"), refills
    movers = [i for i in (2, 3, 4) if any(e["restart"] and e["to_stage"] == 2
                                          for e in swarm.events("moved", who=f"peer-{i:02d}"))]
    assert len(movers) == 1, "one stage 1 peer should have moved to stage 2"
    (loaded,) = swarm.events("stage_loaded", who=f"peer-{movers[0]:02d}")[-1:]
    assert loaded["source"] == "blocks" and loaded["from_stage"] in (0, 1) and loaded["stage"] == 2
    final = swarm.schedule()
    assert final["placement"][ensure_identity(str(run_dir / f"peer-{movers[0]:02d}.key"))] == 2
    assert final["rules"]["unserved"] == [] and all(r["stages"] == [1, 2] for r in final["routes"])
