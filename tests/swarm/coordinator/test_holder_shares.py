"""A data holder the commits show slow is given fewer microbatches, and its share back once it keeps time."""

from __future__ import annotations

import pytest

from swarm.control.messages import Done
from swarm.coordinator.holder_shares import (
    MIN_SHARE,
    OFF,
    RESTORE_AFTER,
    HolderShares,
    holder_microbatches,
)
from swarm.coordinator.scheduler import Scheduler
from swarm.events import EVENT_ATTR
from swarm.run_config import RunConfig
from tests.swarm.coordinator.conftest import make_config, make_scheduler, model_of, read_after_expiry
from tests.swarm.coordinator.test_scheduler import commit, fresh, notices, planned, published


def test_a_holder_late_in_two_of_its_last_three_commits_is_halved_and_one_spike_is_forgiven():
    shares = HolderShares()
    assert shares.committed(["a", "b"], ["c"]) == {}  # one late commit: a load spike
    assert shares.committed(["a", "b", "c"], []) == {}
    assert shares.committed(["a", "b"], ["c"]) == {"c": 0.5}  # late twice in its last three
    assert shares.share("c") == 0.5 and shares.slowed == {"c": 0.5} and shares.share("a") == 1.0
    assert shares.committed(["a", "b"], ["c"]) == {}  # judged afresh at its new share: one more is not two
    assert shares.committed(["a", "b"], ["c"]) == {"c": 0.25}
    assert shares.committed(["a", "b"], ["c"]) == {}
    assert shares.committed(["a", "b"], ["c"]) == {"c": OFF}  # still slow at MIN_SHARE: no share helps
    assert shares.share("c") == MIN_SHARE  # until the caller takes it off the run
    shares.forget(["c"])
    assert shares.share("c") == 1.0 and shares.slowed == {}


def test_a_holder_slow_at_one_microbatch_an_iteration_is_given_none_whatever_its_share():
    shares = HolderShares()
    shares.committed(["a"], ["c"], single=["c"])
    assert shares.committed(["a"], ["c"], single=["c"]) == {"c": OFF}
    assert shares.committed(["a"], ["d"], single=["c"]) == {}
    assert shares.committed(["a"], ["d"], single=["c"]) == {"d": 0.5}  # more than one: halved first


def test_a_slowed_holder_on_time_again_gets_its_share_doubled_back_and_each_restore_waits_longer():
    shares = HolderShares()
    for late in (["c"], [], ["c"]):
        shares.committed(["a", *(["c"] if not late else [])], late)
    assert shares.share("c") == 0.5
    changes = [shares.committed(["a", "c"], []) for _ in range(RESTORE_AFTER)]
    assert changes == [{}] * (RESTORE_AFTER - 1) + [{"c": 1.0}] and shares.slowed == {}
    shares.committed(["a"], ["c"])
    assert shares.committed(["a"], ["c"]) == {"c": 0.5}  # slow again
    changes = [shares.committed(["a", "c"], []) for _ in range(2 * RESTORE_AFTER)]
    assert changes.index({"c": 1.0}) == 2 * RESTORE_AFTER - 1  # the second restore waits twice as long


@pytest.mark.parametrize(("per_shard", "shards", "share", "expected"),
                         [(6, 1, 1.0, 6), (6, 2, 1.0, 12), (6, 0, 1.0, 6), (6, 1, 0.5, 3), (2, 1, 0.25, 1),
                          (6, 2, 0.25, 3)])
def test_a_holders_microbatches_follow_its_shards_and_its_share(per_shard, shards, share, expected):
    assert holder_microbatches(per_shard, shards, share) == expected


def routes_of(schedule, holder: str) -> int:
    return sum(r.origin == holder for r in schedule.routes)


def test_the_scheduler_replans_a_slow_holder_with_half_its_microbatches_from_the_next_iteration(records, caplog):
    """A holder left out of two commits in a row for being late: the second commit publishes an epoch from the
    iteration after the one in progress, on the same placement, in which it injects half its microbatches and the
    others all of theirs. No one is taken for gone; once it has kept time `RESTORE_AFTER` times, it is given its
    whole share back."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 1, now=100.0)
    slow, *others = first.data_holders
    full = routes_of(first, slow)
    t = 100.0
    for _ in range(2):  # late beyond the margin, and beyond three times the margin the next time
        iteration = s.completed
        for h in others:
            s.handle(h, Done(peer=h, iteration=iteration, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=t,
                             finished=t + 1), t + 1)
        s.observe(fresh(records), t + 20)  # every peer beats on
        with caplog.at_level("WARNING"):
            actions = s.check_late_holders(t + 20)
        (committed,) = notices(actions)
        assert committed.left_out == (slow,)
        t += 20
    (replanned,) = published(actions)
    assert replanned.epoch == 1 and replanned.meta["start_iteration"] == s.completed + 1
    assert replanned.placement == first.placement and replanned.meta["joiners"] == []
    assert routes_of(replanned, slow) == full // 2
    assert all(routes_of(replanned, h) == routes_of(first, h) for h in others)
    events = [getattr(r, EVENT_ATTR) for r in caplog.records if getattr(r, EVENT_ATTR, {}).get("event") ==
              "holder_share"]
    assert events == [{"event": "holder_share", "peer": slow, "share": 0.5, "microbatches": full // 2, "was": full,
                       "start_iteration": s.completed + 1}]
    assert not s.liveness.declared_gone
    restored = []
    for _ in range(RESTORE_AFTER):
        t += 2
        s.observe(fresh(records), t)
        restored += published(commit(s, 1, now=t))
    (back,) = restored
    assert back.epoch == 2 and routes_of(back, slow) == full and back.placement == first.placement


def test_lateness_in_an_iteration_that_lost_a_peer_is_not_held_against_a_holder(records, caplog):
    """The same two late commits as above, but a holder died in the second: the slow one's microbatches may have
    gone around the dead, so that commit says nothing about its speed, and its share stays whole."""
    s = make_scheduler("skippipe")
    first = planned(s, records)
    commit(s, 1, now=100.0)
    slow, dead, *others = first.data_holders
    t = 100.0
    for lost in (False, True):
        iteration, epoch = s.completed, s.epochs.in_force(s.completed).epoch
        for h in others:
            s.handle(h, Done(peer=h, iteration=iteration, epoch=epoch, loss_sum=2.0, losses=4, tokens=256, started=t,
                             finished=t + 1), t + 1)
        if not lost:
            s.handle(dead, Done(peer=dead, iteration=iteration, epoch=epoch, loss_sum=2.0, losses=4, tokens=256,
                                started=t, finished=t + 1), t + 1)
        with caplog.at_level("WARNING"):
            read_after_expiry(s, {p: r for p, r in records.items() if not (lost and p == dead)}, t + 20)
            (committed,) = notices(s.check_late_holders(t + 20))
        assert committed.left_out == tuple(sorted((dead, slow) if lost else (slow,)))
        t += 20
    assert s.slow.holders.shares.share(slow) == 1.0
    assert not [r for r in caplog.records if getattr(r, EVENT_ATTR, {}).get("event") == "holder_share"]


def test_a_run_configured_without_holder_shares_keeps_every_holders_microbatches(records):
    """`swarm.holder_shares = false`: the same two late commits re-plan nothing (the setting travels in the run spec,
    so a successor scheduler keeps it)."""
    config = make_config("skippipe", holder_shares=False)
    assert RunConfig.from_spec(config.to_spec(coordinator="c", vocab_size=512))[0].holder_shares is False
    assert "holder_shares" not in make_config().to_spec(coordinator="c", vocab_size=512).hyperparameters
    s = Scheduler(config, model_of(config), "coordinator")
    first = planned(s, records)
    commit(s, 1, now=100.0)
    slow, *others = first.data_holders
    t = 100.0
    for _ in range(2):
        for h in others:
            s.handle(h, Done(peer=h, iteration=s.completed, epoch=0, loss_sum=2.0, losses=4, tokens=256, started=t,
                             finished=t + 1), t + 1)
        s.observe(fresh(records), t + 20)
        actions = s.check_late_holders(t + 20)
        assert [m.left_out for m in notices(actions)] == [(slow,)] and published(actions) == []
        t += 20
