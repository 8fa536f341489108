"""A run with `swarm.message_bytes` trains as usual while every activation and gradient on the wire is padded to
that size: the peers' traces show each pipeline send carrying the padded bytes, and the loss goes down."""

from __future__ import annotations

import math

import pytest

from swarm.local.local_swarm import LocalSwarm
from swarm.peer.timeline import read_spans

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PADDED = 1024 * 1024  # 64 rows of 32 tokens x 128 float32 (the tiny model's real message: 4 rows, 64 KiB)


def test_pipeline_messages_travel_padded_and_the_run_trains(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[run]\nrun_id = 'padded'\nmodel = 'tiny'\nstages = 3\nskip = 0\nmicrobatches = 2\n"
                      f"iterations = 4\nmin_peers = 3\n[data]\nseq_len = 32\nbatch_size = 4\n"
                      f"[swarm]\nheartbeat = 1.0\nmessage_bytes = {PADDED}\n")
    run_dir = tmp_path / "run"
    swarm = LocalSwarm(run_dir, 3, run_id="padded", coordinator_args=["--config", str(config)],
                       peer_args=[["--stage", str(i), "--emulate-speed", "0.02"] for i in range(3)])
    try:
        swarm.start()
        records = swarm.watch(4, timeout=240)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in records) and records[-1]["loss"] < records[0]["loss"]
    sends = [s for s in read_spans(run_dir.glob("peer-*.trace.jsonl"))
             if s["kind"] in ("send_forward", "send_backward")]
    assert {s["kind"] for s in sends} == {"send_forward", "send_backward"}
    assert {s["bytes"] for s in sends} == {PADDED}
