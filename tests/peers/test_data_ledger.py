import os

from peers.data_ledger import DataLedger, read_ledger


def test_the_lines_that_settle_a_draw_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    ledger = DataLedger(tmp_path / "sub" / "ledger.jsonl", holder="a")
    ledger.draw(iteration=0, epoch=0, shard=1, data_epoch=0, microbatch=0, windows=[5])
    ledger.retry(0, microbatch=0, attempt=1)
    assert not synced, "draws and retries are only flushed"
    ledger.commit(0)
    after_commit = len(synced)
    assert after_commit >= 1
    ledger.draw(iteration=1, epoch=0, shard=1, data_epoch=0, microbatch=0, windows=[6])
    ledger.requeue(1)
    assert len(synced) > after_commit
    assert [e["event"] for e in read_ledger(tmp_path / "sub" / "ledger.jsonl")] == \
        ["draw", "retried", "processed", "draw", "requeued"]
    assert read_ledger(tmp_path / "sub" / "ledger.jsonl") == ledger.entries


def test_reopening_a_clean_ledger_keeps_every_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    DataLedger(path, holder="a").commit(0)
    before = path.read_bytes()
    DataLedger(path, holder="a")
    assert path.read_bytes() == before
    path.write_text("")
    DataLedger(path, holder="a")
    assert read_ledger(path) == []


def test_an_in_memory_ledger_writes_nothing(tmp_path):
    ledger = DataLedger(holder="a")
    ledger.commit(0)
    assert ledger.entries == [{"holder": "a", "event": "processed", "iteration": 0}]
    assert not list(tmp_path.iterdir())
