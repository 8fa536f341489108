"""A local swarm where one member of a 3-peer stage group misbehaves on purpose (`--fault byzantine`: gradients
scaled by -1e6, a 3e38 coordinate, a claimed weight of 2^40, one kind per iteration). The two honest members
refuse its contributions and report it, the scheduler evicts it, the run completes with the loss falling, and the
honest members stay bit-identical throughout."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from swarm.local.local_swarm import LocalSwarm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ITERATIONS = 7
PINS = ["0", "0", "0", "1", "1", "1"]  # stage 1's group: peer-03, peer-04 (honest) and peer-05 (faulty)
COORDINATOR_ARGS = ["--iterations", str(ITERATIONS), "--min-peers", str(len(PINS)), "--stages", "2", "--skip", "0",
                    "--seed", "0", "--microbatches", "4"]  # 12 microbatches: every stage-1 peer is on some path


def test_a_faulty_stage_member_is_refused_evicted_and_the_run_completes(tmp_path):
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
    proofs, cuts = {}, {}
    for honest in ("peer-03", "peer-04"):
        refused, cut = defaultdict(set), defaultdict(set)
        for e in swarm.events("gradient_refused", who=honest):
            if e["why"].startswith("refused") and "not a member" not in e["why"]:  # proofs, not late arrivals
                refused[e["sender"]].add(e["iteration"])
            elif e["why"].startswith("weight cut"):
                cut[e["sender"]].add(e["iteration"])
        assert set(refused) <= {faulty}, dict(refused)  # nobody honest was ever refused
        proofs[honest], cuts[honest] = refused[faulty], cut[faulty]
    gone = [e for e in swarm.events("declared_gone", who="coordinator")]
    if proofs["peer-03"] or proofs["peer-04"]:
        # its proven faults (a gradient far outside the stage's history; a -1e6x one before there is any history
        # is only clipped, a claimed 2^40 only cut to what the schedule allows) are refused by both honest
        # members, who report them; two members in two iterations evict it, and the run goes on without it
        assert proofs["peer-03"] == proofs["peer-04"] and len(proofs["peer-03"]) >= 2, proofs
        assert [e["peer"] for e in gone] == [faulty], gone  # the faulty peer, and nobody else
        assert gone[0]["why"].startswith("evicted: its stage 1 averaging input was refused as faulty by 2 members")
        assert faulty not in swarm.schedule()["placement"]  # the last epoch plans without it
    else:  # the plan routed no microbatch through it: whatever it sent weighed nothing, and nobody was evicted
        assert cuts["peer-03"] and not gone, (cuts, gone)
    digests: dict[tuple[int, str], str] = {}
    for honest in ("peer-03", "peer-04"):
        for e in swarm.events("param_digest", who=honest):
            digests[(e["iteration"], honest)] = e["digest"]
    assert all(digests[(i, "peer-03")] == digests[(i, "peer-04")] for i, _ in digests), digests


def test_a_relay_corrupting_activations_is_routed_around_and_taken_out(tmp_path):
    """Stage 1's peer-04 (one of two) passes on activations with non-finite values: the holders refuse them before
    computing, re-queue those microbatches around it, and report it; two reporters take it out, the run completes."""
    pins = PINS[:-1]  # stage 1 has two peers: the corrupt relay serves several holders, who each see it
    peer_args = [["--stage", s, "--iteration-deadline", "120"] for s in pins]
    peer_args[-1] += ["--fault", "corrupt-activations"]
    args = [*COORDINATOR_ARGS]
    args[args.index("--min-peers") + 1] = str(len(pins))
    swarm = LocalSwarm(tmp_path, len(pins), run_id="corrupt", coordinator_args=args, peer_args=peer_args)
    try:
        swarm.start()
        records = swarm.watch(ITERATIONS, timeout=300)
        for proc in swarm.peers:
            proc.wait(timeout=60)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    assert all(math.isfinite(r["loss"]) for r in records)  # no corrupt activation was computed with
    assert records[-1]["loss"] < records[0]["loss"]
    relay = swarm.events("placed", who="peer-04")[0]["node"]
    refused = swarm.events("activation_refused", who="peer-0[0-3]")
    assert refused and {e["sender"] for e in refused} == {relay}, refused  # nobody honest was refused
    gone = [e["peer"] for e in swarm.events("declared_gone", who="coordinator")]
    witnesses = {e["node"] for e in refused}
    if len(witnesses) >= 2:  # two holders routed through it: their reports take it out (each time it comes back)
        assert set(gone) == {relay}, gone
    else:  # one witness alone is no proof (it could be the liar): routed around every time, never evicted
        assert gone == [], gone
