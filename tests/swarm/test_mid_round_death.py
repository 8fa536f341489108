"""A peer dies in the middle of its stage group's averaging round (`--fault crash-mid-average`): its gradients reach
one stage mate whole and never the other, then it kills itself. The first mate averages with them, the second
without, so their copies of the stage differ from that step on. Before, they stayed apart for the rest of the run
(and a joiner of the stage could hear no two veterans agree). Now the next round's lineages show the split, the
stray copy takes the other's state, and the two hold the same weights again, bit for bit.

The run's `swarm.chunk_bytes` is set below the stage's gradient size, so the averaging and the mending state travel
in pieces (`swarm.peer.message_chunks`), as a large model's do.
"""

from __future__ import annotations

import json
import math

import pytest

from swarm.local.local_swarm import LocalSwarm
from swarm.net.identity import ensure_identity
from swarm.peer.faults import CRASH_ITERATION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PINS = ["0", "0", "1", "1", "1", "2", "2"]
CRASHER = 4  # of stage 1, beside peers 2 and 3
MATES = (2, 3)
SLOW_SECONDS_PER_LAYER = 0.2
"""The crasher only splits its group in a round it brings visits to. Plans on equal peers left it out for the whole
run (CI runs of bd6e39b and 6bdd231: all 6 microbatches through one stage-1 mate): both mates are paced far slower
than this machine, so the plan routes through the crasher."""
ITERATIONS = 12
COORDINATOR_ARGS = ["--iterations", str(ITERATIONS), "--min-peers", str(len(PINS)), "--stages", "3", "--skip", "0",
                    "--seed", "0", "--microbatches", "3"]
CHUNK = 256 * 1024  # stage 1's gradients are 1.6 MB, its state 4.8 MB: in pieces
CONFIG = f"[swarm]\nheartbeat = 1.0\nrebalance = false\nchunk_bytes = {CHUNK}\n"  # nobody moves: mates stay on stage 1


def test_stage_mates_split_by_a_death_mid_round_hold_the_same_weights_again_the_round_after(tmp_path):
    peer_args = [["--stage", s, "--iteration-deadline", "60", "--log-param-digest"] for s in PINS]
    peer_args[CRASHER] += ["--fault", "crash-mid-average"]
    for mate in MATES:
        peer_args[mate] += ["--emulate-speed", str(SLOW_SECONDS_PER_LAYER)]
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    swarm = LocalSwarm(run_dir, len(PINS), run_id="mid-round-death",
                       coordinator_args=["--config", str(config), *COORDINATOR_ARGS], peer_args=peer_args)
    try:
        swarm.start()
        records = swarm.watch(ITERATIONS, timeout=300)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records][:ITERATIONS] == list(range(1, ITERATIONS + 1))
    assert all(math.isfinite(r["loss"]) for r in records)
    crasher = ensure_identity(str(run_dir / f"peer-{CRASHER:02d}.key"))
    assert crasher in {e["peer"] for e in swarm.events("declared_gone", who="coordinator")}
    digests = [{e["iteration"]: e["digest"] for e in swarm.events("param_digest", who=f"peer-{i:02d}")}
               for i in MATES]
    assert all(e["stage"] == 1 for i in MATES for e in swarm.events("param_digest", who=f"peer-{i:02d}"))
    both = sorted(set(digests[0]) & set(digests[1]))
    # the death split the stage: one mate stepped with the crasher's gradients, the other without (in the first
    # round from CRASH_ITERATION on that the crasher brought visits to)
    split = [i for i in both if digests[0][i] != digests[1][i]]
    assert split and split[0] >= CRASH_ITERATION, {i: (digests[0][i], digests[1][i]) for i in both}
    # the next round found it, and the stray took the other's state: the same weights from then on
    assert split == [split[0]], {i: (digests[0][i], digests[1][i]) for i in both}
    mended = [e for i in MATES for e in swarm.events("stage_mended", who=f"peer-{i:02d}")]
    assert [(e["iteration"], e["loaded"]) for e in mended] == [(split[0] + 1, True)], mended
    assert both[-1] >= ITERATIONS - 2 and both[-1] > split[0] + 1, both
    # the gradients and the state went in pieces
    sends = [json.loads(line) for i in MATES for line in (run_dir / f"peer-{i:02d}.trace.jsonl").open()
             if '"send_' in line]
    for kind in ("send_average", "send_state"):
        sizes = {e["bytes"] for e in sends if e["kind"] == kind}
        assert sizes and max(sizes) <= CHUNK, (kind, sizes)  # each message alone would be larger
