"""A local swarm with two hostile peers at once, each in a stage group of its own.

Stage 1's group has three members, one of which misbehaves on purpose (`--fault byzantine`: gradients scaled by
-1e6, a 3e38 coordinate, a claimed weight of 2^40, one kind per iteration). The two honest members refuse its
contributions and report it, the scheduler evicts it, and the honest members stay bit-identical throughout.

Stage 2's group has two members, one of which is a relay that passes on activations with non-finite values
(`--fault corrupt-activations`): the holders it forwards to refuse them before computing, re-queue those
microbatches around it, and report it; two reporters take it out, one alone never does.

One swarm carries both (its start-up and the run are the test's cost); the run completes with the loss falling
and finite throughout, and nobody honest is refused or evicted.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from swarm.local.local_swarm import LocalSwarm
from swarm.net.identity import ensure_identity

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ITERATIONS = 7
# stage 1's group: peer-02, peer-03 (honest) and peer-04 (faulty); stage 2's: peer-05 (honest) and peer-06, the
# corrupt relay, which serves both holders, who each see it
PINS = ["0", "0", "1", "1", "1", "2", "2"]
FAULTY, RELAY = 4, 6
HONEST_STAGE_1 = ("peer-02", "peer-03")
COORDINATOR_ARGS = ["--iterations", str(ITERATIONS), "--min-peers", str(len(PINS)), "--stages", "3", "--skip", "0",
                    "--seed", "0", "--microbatches", "6"]  # 12 microbatches: every stage 1 peer is on some path
# a heartbeat overdue (1.5 beats) corroborates a single report: with 7 peers on a small machine a busy relay can
# miss a 2 s beat, and the test is about proofs of faults, not liveness
# and no rebalancing: once the relay is evicted, a rebalance may move an honest stage 1 member to stage 2 (seen in a
# clean-clone run), leaving the faulty member one honest witness; the two scenarios must not interact
CONFIG = "[swarm]\nheartbeat = 3.0\nrebalance = false\n"


def test_a_faulty_member_and_a_corrupting_relay_are_taken_out_and_the_run_completes(tmp_path):
    peer_args = [["--stage", s, "--log-param-digest", "--iteration-deadline", "120"] for s in PINS]
    peer_args[FAULTY] += ["--fault", "byzantine"]
    peer_args[RELAY] += ["--fault", "corrupt-activations"]
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    swarm = LocalSwarm(run_dir, len(PINS), run_id="hostile", coordinator_args=["--config", str(config),
                                                                              *COORDINATOR_ARGS], peer_args=peer_args)
    try:
        swarm.start()
        records = swarm.watch(ITERATIONS, timeout=300)
        faulty, relay = (ensure_identity(str(run_dir / f"peer-{i:02d}.key")) for i in (FAULTY, RELAY))
        evicted = {e["peer"] for e in swarm.events("declared_gone", who="coordinator")}
        for i, proc in enumerate(swarm.peers):
            if {FAULTY: faulty, RELAY: relay}.get(i) not in evicted:
                proc.wait(timeout=60)  # every peer still in the run finishes it and leaves by itself
        # (an evicted one hears that the run is over only when its own deadline passes: it is stopped instead)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    assert all(math.isfinite(r["loss"]) for r in records)  # no corrupt activation was computed with
    assert records[-1]["loss"] < records[0]["loss"]
    assert swarm.events("placed", who=f"peer-{FAULTY:02d}") and swarm.events("placed", who=f"peer-{RELAY:02d}")
    gone = swarm.events("declared_gone", who="coordinator")
    assert {e["peer"] for e in gone} <= {faulty, relay}, gone  # nobody honest was evicted
    gone_faulty = [e for e in gone if e["peer"] != relay]
    gone_relay = [e["peer"] for e in gone if e["peer"] != faulty]

    # the faulty stage member
    proofs, cuts = {}, {}
    for honest in HONEST_STAGE_1:
        refused, cut = defaultdict(set), defaultdict(set)
        for e in swarm.events("gradient_refused", who=honest):
            if e["why"].startswith("refused") and "not a member" not in e["why"]:  # proofs, not late arrivals
                refused[e["sender"]].add(e["iteration"])
            elif e["why"].startswith("weight cut"):
                cut[e["sender"]].add(e["iteration"])
        assert set(refused) <= {faulty}, dict(refused)  # nobody honest was ever refused
        proofs[honest], cuts[honest] = refused[faulty], cut[faulty]
    if proofs["peer-02"] or proofs["peer-03"]:
        # its proven faults (a gradient far outside the stage's history; a -1e6x one before there is any history
        # is only clipped, a claimed 2^40 only cut to what the schedule allows) are refused by both honest
        # members, who report them; two members in two iterations evict it, and the run goes on without it
        assert proofs["peer-02"] == proofs["peer-03"] and len(proofs["peer-02"]) >= 2, proofs
        assert [e["peer"] for e in gone_faulty] == [faulty], gone  # the faulty peer, once
        assert gone_faulty[0]["why"].startswith(
            "evicted: its stage 1 averaging input was refused as faulty by 2 members")
        # every commit after the eviction leaves it out: its epoch plans without it, or the commit names it left out
        # (an eviction in the same look as the last commit is followed by no new epoch: the run is over; seen in CI)
        evicted_at = gone_faulty[0]["time"]
        placements = {s["epoch"]: s["placement"] for s in swarm.schedules()}
        after = [r for r in records if r["time"] > evicted_at]
        assert all(faulty not in placements[r["epoch"]] or faulty in r["left_out"] for r in after), after
        replanned = any(e["time"] >= evicted_at for e in swarm.events("replanned", who="coordinator"))
        assert replanned or len(after) <= 1, after  # an iteration that starts after it is planned without it
        if replanned:
            assert faulty not in swarm.schedule()["placement"]
    else:  # the plan routed no microbatch through it: whatever it sent weighed nothing, and nobody was evicted
        assert cuts["peer-02"] and not gone_faulty, (cuts, gone)
    digests: dict[tuple[int, str], str] = {}
    for honest in HONEST_STAGE_1:
        for e in swarm.events("param_digest", who=honest):
            digests[(e["iteration"], honest)] = e["digest"]
    assert all(digests[(i, "peer-02")] == digests[(i, "peer-03")] for i, _ in digests), digests

    # the corrupting relay: everyone else refuses its forwards, and nobody else's
    refused = [e for e in swarm.events("activation_refused") if e["node"] != relay]
    assert {e["sender"] for e in refused} <= {relay}, refused  # nobody honest was refused
    if not refused:
        # it passed nothing on: no route went through it, or (seen once in a clean-clone run on a loaded machine)
        # it was taken out before its first forward; either way nothing it sent was computed with (finite losses)
        routed = any(relay in r["peers"] for r in swarm.schedules()[0]["routes"])
        assert not routed or relay in gone_relay, (routed, gone)
        return
    witnesses = {e["node"] for e in refused}
    if len(witnesses) >= 2:  # two peers routed through it: their reports take it out (each time it comes back)
        assert set(gone_relay) == {relay}, gone
    else:  # one witness alone is no proof (it could be the liar): routed around every time, never evicted
        assert gone_relay == [], gone
