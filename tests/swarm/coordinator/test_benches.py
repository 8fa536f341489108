"""A data holder still late at its smallest share is taken off the run's work for a while, then placed again."""

from __future__ import annotations

import dataclasses

from swarm.control.messages import Benched, Done, Gone
from swarm.coordinator.benches import BENCH, MAX_BENCH, Benches
from swarm.coordinator.scheduler import Scheduler
from swarm.events import EVENT_ATTR
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord, PeerState
from tests.swarm.coordinator.conftest import make_config, make_scheduler, model_of
from tests.swarm.coordinator.test_scheduler import commit, fresh, notices, planned, published


def test_a_bench_ends_after_its_time_and_each_one_of_the_same_peer_lasts_twice_as_long_up_to_a_cap():
    benches = Benches()
    assert benches.bench("a", 0.0) == BENCH and benches.benched(BENCH - 1) == {"a"}
    assert benches.benched(BENCH) == set()
    assert benches.bench("a", 1000.0) == 2 * BENCH and benches.benched(1000.0 + 2 * BENCH - 1) == {"a"}
    assert benches.bench("b", 0.0) == BENCH  # each peer its own count
    for _ in range(10):
        seconds = benches.bench("a", 0.0)
    assert seconds == MAX_BENCH
    short, long = Benches(first=15.0), Benches(first=2 * MAX_BENCH)  # the run's swarm.bench_seconds
    assert [short.bench("a", 0.0) for _ in range(3)] == [15.0, 30.0, 60.0] and long.bench("a", 0.0) == 2 * MAX_BENCH
    assert long.bench("a", 0.0) == 2 * MAX_BENCH  # the cap is never below the first bench


def late_twice(s: Scheduler, records: dict[str, PeerRecord], slow: str, t: float) -> tuple[list, float]:
    """An iteration every holder reports (after two left out, a holder is waited for: `LATE_STREAK`), then two that
    every holder but `slow` reports at once and `slow` not at all: each commits without it, late. The actions of the
    last commit, and the time after it."""
    commit(s, 1, now=t)
    for _ in range(2):
        running = s.epochs.in_force(s.completed)
        for h in running.data_holders:
            if h != slow:
                s.handle(h, Done(peer=h, iteration=s.completed, epoch=running.epoch, loss_sum=2.0, losses=4,
                                 tokens=256, started=t, finished=t + 1), t + 1)
        s.observe(fresh(records), t + 20)
        actions = s.check_late_holders(t + 20)
        assert [m.left_out for m in notices(actions) if hasattr(m, "left_out")][0] == (slow,)
        t += 20
    return actions, t


def test_a_holder_late_at_one_microbatch_is_benched_then_placed_again_at_its_whole_share(records, caplog):
    """Halved twice (4 -> 2 -> 1 microbatches) and late still: it is told it is benched, the others are told to go
    around it, and an epoch without it starts at the next iteration, its shard carried by another holder. It is not
    taken for gone; asking to be placed again, it waits out its bench, then is placed like any joiner, afresh."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 1, now=100.0)
    slow = first.data_holders[0]
    t = 100.0
    counts = []
    for _ in range(2):
        actions, t = late_twice(s, records, slow, t)
        (replanned,) = published(actions)
        counts.append(len(replanned.routes_from(slow)))
    assert counts == [2, 1]
    with caplog.at_level("WARNING"):
        actions, t = late_twice(s, records, slow, t)
    in_progress = s.completed
    told = notices(actions)
    assert Benched(peer=slow, iteration=in_progress, seconds=BENCH) in told
    assert Gone(peers=(slow,), iteration=in_progress, epoch=s.epochs.in_force(in_progress).epoch) in told
    (benched,) = published(actions)
    assert slow not in benched.placement and benched.meta["start_iteration"] == in_progress + 1
    assert sorted(k for ks in benched.meta["shards"].values() for k in ks) == list(range(len(first.data_holders)))
    assert slow not in s.liveness.declared_gone
    events = [getattr(r, EVENT_ATTR) for r in caplog.records if getattr(r, EVENT_ATTR, {}).get("event") ==
              "holder_benched"]
    assert events == [{"event": "holder_benched", "peer": slow, "seconds": BENCH, "iteration": in_progress}]
    commit(s, 1, now=t)  # the iteration in progress commits without it
    assert s.completed == in_progress + 1

    records[slow] = dataclasses.replace(records[slow], state=PeerState.JOINING)  # it asks to be placed again
    assert published(s.observe(fresh(records), t + 10)) == []
    assert published(s.observe(fresh(records), t + BENCH - 1)) == []  # still benched
    (back,) = published(s.observe(fresh(records), t + BENCH + 1))
    assert slow in back.placement and s.slow.holders.shares.share(slow) == 1.0  # like any joiner, afresh


def test_a_run_configured_without_benches_keeps_a_slow_holder_at_one_microbatch(records):
    """`swarm.bench_seconds = 0`: the same slow holder is halved twice and stays (the setting travels in the run
    spec, so a successor scheduler keeps it)."""
    config = make_config("skippipe", bench_seconds=0)
    assert RunConfig.from_spec(config.to_spec(coordinator="c", vocab_size=512))[0].bench_seconds == 0
    assert "bench_seconds" not in make_config().to_spec(coordinator="c", vocab_size=512).hyperparameters
    s = Scheduler(config, model_of(config), "coordinator")
    first = planned(s, records)
    commit(s, 1, now=100.0)
    slow = first.data_holders[0]
    t = 100.0
    for expected in (2, 1, None):
        actions, t = late_twice(s, records, slow, t)
        assert not any(isinstance(m, (Benched, Gone)) for m in notices(actions))
        assert [len(e.routes_from(slow)) for e in published(actions)] == ([expected] if expected else [])
    assert slow in s.schedule.placement and not s.slow.benched(t)
