"""Attacks on the scheduler through the reports every admitted peer may send (on gossip, signed by their sender).

Each worked against the scheduler that believed one reporter: an 'unreachable' then a 'broken' report had any
peer declared gone; 50 'stuck' reports caused 50 restarts and no iteration completed; a 'done' report's shard
positions were taken whatever shards they named, so one holder could move everyone's data (or grow the commit past
what gossip carries).
"""

from __future__ import annotations

from swarm.control.messages import Broken, Commit, Done, Stuck, Unreachable
from swarm.coordinator.actions import PublishSchedule
from tests.swarm.coordinator.conftest import make_records, make_scheduler


def _planned(s, records):
    fresh = {p: (r, 0.5) for p, r in records.items()}
    s.observe(fresh, 0.0)
    (action,) = [a for a in s.observe(fresh, 60.0) if isinstance(a, PublishSchedule)]
    return action.schedule


def _done(holder: str, iteration: int, epoch: int, shards: dict | None = None) -> Done:
    return Done(peer=holder, iteration=iteration, epoch=epoch, loss_sum=2.0, losses=4, tokens=256, started=100.0,
                finished=101.0, shards=shards or {})


def test_one_liar_cannot_get_a_peer_declared_gone():
    records = make_records()
    s = make_scheduler()
    schedule = _planned(s, records)
    liar, victim = [p for p, st in schedule.placement.items() if st != 0][:2]
    for microbatch in range(20):
        s.handle(liar, Unreachable(peer=victim), 61.0)
        s.handle(liar, Broken(peer=liar, iteration=0, epoch=0, microbatch=microbatch, attempt=0, gone=victim), 61.0)
    assert victim in s.liveness.live(61.0)


def test_stuck_reports_from_one_peer_cannot_stall_the_run():
    records = make_records()
    s = make_scheduler()
    schedule = _planned(s, records)
    liar = next(iter(schedule.placement))
    restarts = []
    for _ in range(50):
        restarts += [a for a in s.handle(liar, Stuck(peer=liar, iteration=0, epoch=0), 62.0)
                     if isinstance(a, PublishSchedule)]
    assert restarts == []
    commits = []
    for holder in schedule.data_holders:  # the iteration completes as if nothing had been said
        commits += [a.message for a in s.handle(holder, _done(holder, 0, 0), 63.0) if hasattr(a, "message")]
    assert [c.iteration for c in commits if isinstance(c, Commit)] == [0] and s.completed == 1


def test_a_holder_cannot_move_other_holders_shards():
    records = make_records()
    s = make_scheduler()
    schedule = _planned(s, records)
    liar, *others = schedule.data_holders
    position = {"holder": 0, "num_holders": 3, "epoch": 0, "cursor": 10**9}
    foreign = {str(k): position for h in others for k in schedule.meta["shards"][h]}
    every = {str(k): position for k in range(1000)}
    for shards in (foreign, every):
        assert s.handle(liar, _done(liar, 0, 0, shards), 61.0) == []
    for holder in others:
        s.handle(holder, _done(holder, 0, 0), 61.0)
    assert s.completed == 0  # the liar's report was refused: the iteration waits for an honest one from it
    (commit,) = [a.message for a in s.handle(liar, _done(liar, 0, 0), 62.0) if isinstance(getattr(a, "message", None),
                                                                                          Commit)]
    assert commit.shards == {}


def test_two_members_evict_a_faulty_peer_and_one_liar_evicts_nobody():
    from swarm.control.messages import Faulty, Refused

    records = make_records()
    s = make_scheduler()
    schedule = _planned(s, records)
    stage = next(st for st in set(schedule.placement.values()) if len(schedule.stage_peers(st)) >= 3)
    a, b, suspect = schedule.stage_peers(stage)[:3]
    elsewhere = next(p for p, st in schedule.placement.items() if st != stage)

    def faulty(reporter: str, target: str, iteration: int = 0) -> list:
        return s.handle(reporter, Faulty(peer=reporter, suspect=target, iteration=iteration, epoch=0, why="x"), 61.0)

    for iteration in range(5):  # one liar, however often it says so
        assert faulty(a, suspect, iteration) == [] and faulty(a, b, iteration) == []
    assert faulty(elsewhere, suspect) == []  # not a member of the suspect's group: no vote
    assert faulty(b, suspect, iteration=0) == []  # two votes: one strike (honest members agree on an honest spike)
    (announce,) = faulty(b, suspect, iteration=3)  # a second iteration with two votes: evicted
    assert announce.message == Refused(peer=suspect, why=announce.message.why, evicted=True)
    assert "evicted" in announce.message.why and suspect in s.suspicions.evicted
    assert suspect not in s.liveness.live(61.0) and a in s.liveness.live(61.0) and b in s.liveness.live(61.0)
    # the next commit tells every member of the group to leave its input out, all the same way (an evicted data
    # holder's report is neither waited for nor counted)
    actions = [x for holder in schedule.data_holders for x in s.handle(holder, _done(holder, 0, 0), 62.0)]
    (commit,) = [a.message for a in actions if isinstance(getattr(a, "message", None), Commit)]
    assert suspect in commit.left_out and a not in commit.left_out
