"""Data holders late against the others.

A data holder freezes in the middle of an iteration's pipeline (its whole process tree stopped: nothing is reset,
nothing answers). The others must not wait for its record to expire: once they reported the iteration and it is late
against them (`swarm.coordinator.commit_tracker.overdue`), the iteration commits without its draws, its stage mates
probe it, and it is taken for gone on their unanswered probes (or sooner, on the reports of the relays that cannot
reach it); the run goes on, and every sample drawn is still processed exactly once.

A local swarm of 6 peers (3 stages) beats every 8 s, so a record expires 16-26 s after a freeze, far beyond an
iteration. Compute is emulated at 0.05 s a layer, so that most of an iteration is its pipeline (where a holder's
'done' is awaited) rather than the averaging (where a frozen member is found by its mates' probes already): the
freeze, 0.3 s after a commit, lands in the pipeline. Before late holders were left out, the iteration waited for the
frozen holder until its record expired.

A data holder that is merely slow (its process runs 0.05 s in every 1.55 s from iteration 3 on: a volunteer's machine
taken by another job) is left out of iterations it is late in, but never taken for gone: it answers its mates' probes;
it is left out of two commits in a row at most, so it still has iterations counted; left out twice in three, it is
given half its microbatches (one) by a re-plan on the same placement; still late twice in three at one microbatch, it
is benched: told so, planned without for a while (15 s here), alive and asking to be placed again, while the run goes
on without it. Its machine's other job ends as it is benched (the throttle is lifted): after its bench it is placed
again like a joiner, loads its stage, and is counted in every commit from then on. No copy of a stage is mended, and
every sample is processed once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import pytest

from peers.data_ledger import committed, read_ledger, sample_status
from swarm.local.local_swarm import LocalSwarm
from swarm.local.throttle import Throttle
from swarm.net.identity import ensure_identity
from tests.utils.freezing import frozen_host

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

PEERS = 6
FROZEN_AFTER = 5
ITERATIONS = 12
SLOW_ITERATIONS = 36
"""The run's length: enough for the slow holder's two verdicts (each takes two late commits of three, ~17 iterations
in all with its bench); the swarm is stopped `SERVED_AFTER_RETURN` iterations after the throttled peer's return."""
SERVED_AFTER_RETURN = 3
"""Iterations committed after the throttled peer is placed again before the swarm is stopped."""
BENCH_SECONDS = 15.0
HEARTBEAT = 8.0
EXPIRY_FLOOR = 2 * HEARTBEAT
"""The soonest a frozen peer's record can expire after the freeze (its last beat may have been just before it)."""


def run_config(tmp_path, run_id: str, iterations: int = ITERATIONS, swarm: str = "") -> tuple[str, list[list[str]]]:
    """The coordinator's config file (`swarm`: more lines of its [swarm] table) and each peer's flags: compute emulated
    at 0.05 s a layer, ledgers kept."""
    config = tmp_path / "run.toml"
    config.write_text(f"[run]\nrun_id = '{run_id}'\nstages = 3\nskip = 0.33\nmicrobatches = 2\n"
                      f"iterations = {iterations}\nmin_peers = {PEERS}\nseed = 0\n[swarm]\nheartbeat = {HEARTBEAT}\n"
                      f"{swarm}")
    args = [["--iteration-deadline", "120", "--emulate-speed", "0.05",
             "--ledger", str(tmp_path / "run" / f"ledger-{i:02d}.jsonl")] for i in range(PEERS)]
    return str(config), args


def processed_once(run_dir, records: list[dict]) -> Counter:
    """How many samples the ledgers show processed how many times, by the scheduler's commits (`records`, iterations
    1 to n). A sample not processed but drawn in an iteration past the last commit was in flight when the swarm was
    stopped: it is not counted."""
    entries = [e for f in sorted(run_dir.glob("ledger-*.jsonl")) for e in read_ledger(f)]
    in_flight = {(e["shard"], e["data_epoch"], w) for e in entries
                 if e["event"] == "draw" and e["iteration"] >= len(records) for w in e["windows"]}
    status = sample_status(entries, committed(records))
    return Counter(c["processed"] for key, c in status.items() if c["processed"] or key not in in_flight)


def test_a_frozen_holder_is_left_out_of_the_commit_and_found_by_its_mates_probes(tmp_path):
    config, args = run_config(tmp_path, "late")
    run_dir = tmp_path / "run"
    swarm = LocalSwarm(run_dir, PEERS, run_id="late", coordinator_args=["--config", config], peer_args=args)
    try:
        swarm.start()
        swarm.watch(FROZEN_AFTER, timeout=240)
        time.sleep(0.3)  # the peers average and step (~0.1 s): the next iteration's pipeline is under way
        ids = {ensure_identity(str(run_dir / f"peer-{i:02d}.key")): i for i in range(PEERS)}
        victim = max({r["origin"] for r in swarm.schedule()["routes"]})  # a data holder
        frozen_at = time.time()
        with frozen_host(swarm, swarm.peers[ids[victim]]):
            records = swarm.watch(ITERATIONS, timeout=240)
    finally:
        swarm.stop()
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))
    excused = [e for e in swarm.events("holders_excused", who="coordinator") if victim in e["peers"]]
    gone = swarm.events("declared_gone", who="coordinator")
    assert [e["peer"] for e in gone] == [victim], gone  # the frozen holder, and no live one
    first = next(r for r in records if victim in r["left_out"])
    assert first["time"] - frozen_at < EXPIRY_FLOOR, first  # the others' work did not wait for its record
    assert gone[0]["time"] - frozen_at < EXPIRY_FLOOR, gone  # found by its mates, not by its record's expiry
    # left out for being late, or declared gone on its mates' reports before the margin was out (a CI run on a
    # loaded host: two relays' reports 6 s after the freeze), never waited for
    assert excused or gone[0]["time"] <= first["time"], "the frozen holder was waited for: neither late nor gone"
    processed = processed_once(run_dir, records)
    assert processed and set(processed) == {1}, f"samples processed {dict(processed)} times"


class ThrottledRun(NamedTuple):
    swarm: LocalSwarm
    records: list[dict]
    ids: dict[str, int]
    """Peer id -> its index in the swarm (`peer-NN`)."""
    victim: str
    throttled_at: float


def run_throttled_until_benched(tmp_path, run_id: str, iterations: int, benched_event: str,
                                pick: Callable[[dict], str]) -> ThrottledRun:
    """A swarm of `PEERS` (benches of `BENCH_SECONDS`) whose peer `pick(first schedule)` is throttled to 0.05 s of
    every 1.55 s once iteration 3 is committed, until the coordinator's `benched_event` names it: its machine's other
    job ends as it is benched. Stops the swarm `SERVED_AFTER_RETURN` iterations after the epoch that places it again
    started (or after `iterations`, the run's length)."""
    config, args = run_config(tmp_path, run_id, iterations, f"bench_seconds = {BENCH_SECONDS}\n")
    run_dir = tmp_path / "run"
    swarm = LocalSwarm(run_dir, PEERS, run_id=run_id, coordinator_args=["--config", config], peer_args=args)
    throttle: list[Throttle] = []

    def lift_once_benched(_record: dict) -> None:
        if throttle and swarm.events(benched_event, who="coordinator"):
            throttle.pop().close()

    def served_since_return(records: list[dict]) -> bool:
        back = [e["start_iteration"] for e in swarm.events("replanned", who="coordinator") if e["joining"] == [victim]]
        return bool(back) and records[-1]["iteration"] >= back[0] + SERVED_AFTER_RETURN

    try:
        swarm.start()
        swarm.watch(3, timeout=240)
        ids = {ensure_identity(str(run_dir / f"peer-{i:02d}.key")): i for i in range(PEERS)}
        victim = pick(swarm.schedule())
        throttled_at = time.time()
        throttle.append(Throttle(swarm.peers[ids[victim]].pid, running=0.05, stopped=1.5).start())
        records = swarm.watch(iterations, timeout=420, on_record=lift_once_benched, until=served_since_return)
    finally:
        for t in throttle:
            t.close()
        swarm.stop()
    return ThrottledRun(swarm, records, ids, victim, throttled_at)


@pytest.mark.timeout(600)  # ~20 iterations, a throttled holder among them: past 420 s on a loaded 2-core host
def test_a_slow_holder_is_left_out_when_late_then_given_less_work_then_benched_then_placed_again(tmp_path):
    swarm, records, ids, victim, _ = run_throttled_until_benched(
        tmp_path, "slow", SLOW_ITERATIONS, "holder_benched",
        lambda schedule: max({r["origin"] for r in schedule["routes"]}))  # a data holder
    run_dir = tmp_path / "run"
    assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
    shares = swarm.events("holder_share", who="coordinator")
    assert [(e["peer"], e["microbatches"], e["was"]) for e in shares] == [(victim, 1, 2)], shares
    (bench,) = swarm.events("holder_benched", who="coordinator")  # from the iteration in progress (0-based)
    assert bench["peer"] == victim and bench["iteration"] > shares[0]["start_iteration"]
    # left out for being late until then (record iterations are 1-based), then for being benched
    left_out = [r["iteration"] for r in records if victim in r["left_out"] and r["iteration"] <= bench["iteration"]]
    assert left_out, "the slow holder was never late enough to be left out"
    assert not any(c == a + 2 for a, c in zip(left_out, left_out[2:])), left_out  # never three times in a row
    assert any(victim not in r["left_out"] for r in records[left_out[0]:]), "its draws were never counted again"
    assert not swarm.events("declared_gone", who="coordinator"), "a live, slow holder was taken for gone"
    # its peer was told; the membership re-plans are the bench's and, once it is over, the victim's placement
    who = f"peer-{ids[victim]:02d}"
    assert [e["iteration"] for e in swarm.events("benched", who=who)] == [bench["iteration"]]
    replans = swarm.events("replanned", who="coordinator")
    assert [(e["gone"], e["joining"]) for e in replans] == [([victim], []), ([], [victim])], replans
    assert replans[1]["time"] - bench["time"] >= BENCH_SECONDS  # not before its bench was over
    # its place until benched, through its share's re-plan and any re-plan of the paths around its links (throttled,
    # it sends and answers slowly, so they measure slow: `costs_drifted`, on the same placement)
    epochs = {e["epoch"]: e for e in swarm.schedules()}
    benched_at = min(n for n, e in epochs.items() if victim not in e["placement"])
    back_at = min(n for n, e in epochs.items() if n > benched_at and victim in e["placement"])
    assert all((victim in e["placement"]) == (not benched_at <= n < back_at) for n, e in epochs.items())
    assert len(epochs) == 4 + sum(e["replanned"] for e in swarm.events("costs_drifted", who="coordinator"))
    returns = epochs[back_at]["meta"]["start_iteration"]
    without = [r for r in records if bench["iteration"] + 1 < r["iteration"] <= returns]
    assert without and all(benched_at <= r["epoch"] < back_at for r in without)
    back = [r for r in records if r["iteration"] > returns]
    assert back and all(r["epoch"] >= back_at and victim not in r["left_out"] for r in back), back  # counted again
    placed = swarm.events("placed", who=who)
    assert len(placed) == 2 and placed[1]["epoch"] == back_at, placed  # it waited out its bench, then was placed again
    assert not swarm.events("stage_mended"), "a stage copy went apart"
    # what relays took back out of their gradients was the left-out holders' only (iterations: 0-based)
    for e in [e for e in swarm.events("unlearnt") if e["iteration"] < len(records)]:
        record = records[e["iteration"]]
        origin = {r["microbatch"]: r["origin"] for r in epochs[record["epoch"]]["routes"]}
        assert e["microbatches"] and {origin[mb] for mb in e["microbatches"]} <= set(record["left_out"]), e
    processed = processed_once(run_dir, records)
    assert processed and set(processed) == {1}, f"samples processed {dict(processed)} times"
