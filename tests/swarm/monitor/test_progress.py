"""ProgressLog: iteration lines from the holders' reports and the scheduler's commits, as an onlooker hears them."""

from __future__ import annotations

from swarm.control.messages import Commit, Done
from swarm.monitor.progress import MAX_PENDING, ProgressLog


def done(peer: str, iteration: int, *, epoch: int = 0, loss_sum: float = 8.0, losses: int = 2, tokens: int = 512,
         started: float = 100.0, finished: float = 101.0) -> Done:
    return Done(peer=peer, iteration=iteration, epoch=epoch, loss_sum=loss_sum, losses=losses, tokens=tokens,
                started=started, finished=finished)


def test_a_commit_becomes_the_coordinators_metrics_line_with_the_planned_time():
    log = ProgressLog()
    assert log.add_done("h1", done("h1", 3, started=100.0, finished=101.0), holders={"h1", "h2"})
    assert log.add_done("h2", done("h2", 3, loss_sum=4.0, started=100.5, finished=102.0), holders={"h1", "h2"})
    line = log.add_commit(Commit(iteration=3, epoch=0), peers_online=5, planned_seconds=1.5)
    assert line["iteration"] == 4  # 1-based, as in metrics.jsonl
    assert line["loss"] == 3.0  # (8 + 4) / 4
    assert line["iteration_seconds"] == 2.0 and line["tokens_per_s"] == 512.0
    assert line["planned_seconds"] == 1.5 and line["holders_heard"] == 2 and line["peers_online"] == 5
    assert list(log.lines) == [line]
    assert log.add_commit(Commit(iteration=3, epoch=0), peers_online=5, planned_seconds=1.5) is None  # once


def test_reports_from_others_than_the_epochs_holders_are_not_counted():
    log = ProgressLog()
    assert not log.add_done("mallory", done("mallory", 0, loss_sum=1e9), holders={"h1"})
    assert not log.add_done("mallory", done("h1", 0, loss_sum=1e9), holders={"h1"})  # speaking for another
    assert log.add_done("h1", done("h1", 0), holders={"h1"})
    line = log.add_commit(Commit(iteration=0, epoch=0), peers_online=1, planned_seconds=None)
    assert line["loss"] == 4.0 and line["planned_seconds"] is None


def test_a_commit_never_heard_reported_gives_no_line_and_pending_reports_are_bounded():
    log = ProgressLog(keep=3)
    assert log.add_commit(Commit(iteration=0, epoch=0), peers_online=1, planned_seconds=None) is None
    for i in range(MAX_PENDING + 10):
        log.add_done("h1", done("h1", i), holders={"h1"})
    assert log.add_commit(Commit(iteration=0, epoch=0), peers_online=1, planned_seconds=None) is None  # dropped
    for i in range(MAX_PENDING + 5, MAX_PENDING + 10):
        assert log.add_commit(Commit(iteration=i, epoch=0), peers_online=1, planned_seconds=None) is not None
    assert [line["iteration"] for line in log.lines] == [MAX_PENDING + 8, MAX_PENDING + 9, MAX_PENDING + 10]
