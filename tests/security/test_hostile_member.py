"""A local swarm where one member of a 3-peer stage group misbehaves on purpose (`--fault byzantine`: gradients
scaled by -1e6, a 3e38 coordinate, a claimed weight of 2^40, one kind per iteration). The run completes, the
loss falls, the two honest members refuse or cut every faulty contribution and stay bit-identical."""

from __future__ import annotations

from collections import defaultdict

import pytest

from swarm.local.local_swarm import LocalSwarm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ITERATIONS = 9
PINS = ["0", "0", "0", "1", "1", "1"]  # stage 1's group: peer-03, peer-04 (honest) and peer-05 (faulty)
COORDINATOR_ARGS = ["--iterations", str(ITERATIONS), "--min-peers", str(len(PINS)), "--stages", "2", "--skip", "0",
                    "--seed", "0", "--microbatches", "2"]


def test_a_faulty_stage_member_is_refused_and_the_run_completes(tmp_path):
    peer_args = [["--stage", s, "--log-param-digest", "--iteration-deadline", "120"] for s in PINS]
    peer_args[-1] += ["--fault", "byzantine"]
    swarm = LocalSwarm(tmp_path, len(PINS), run_id="hostile", coordinator_args=COORDINATOR_ARGS,
                       peer_args=peer_args)
    try:
        swarm.start()
        records = swarm.watch(ITERATIONS, timeout=300)
        for proc in swarm.peers:
            proc.wait(timeout=60)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    assert records[-1]["loss"] < records[0]["loss"]
    faulty = swarm.events("placed", who="peer-05")[0]["node"]
    for honest in ("peer-03", "peer-04"):
        refused = defaultdict(set)
        for e in swarm.events("gradient_refused", who=honest):
            refused[e["sender"]].add(e["iteration"])
        assert set(refused) == {faulty}, dict(refused)  # nobody honest was ever refused
        # every iteration's faulty contribution was refused (far outside the stage's history), cut (its weight),
        # or clipped (the first, before there is any history)
        assert refused[faulty] == set(range(ITERATIONS)), sorted(refused[faulty])
    digests: dict[tuple[int, str], str] = {}
    for honest in ("peer-03", "peer-04"):
        for e in swarm.events("param_digest", who=honest):
            digests[(e["iteration"], honest)] = e["digest"]
    assert all(digests[(i, "peer-03")] == digests[(i, "peer-04")] for i, _ in digests), digests
