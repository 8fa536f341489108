"""Timelines: spans written per peer, read back (torn lines skipped) and laid out as a Chrome trace."""

from __future__ import annotations

import json

from swarm.peer.timeline import Timeline, chrome_trace, read_spans


def test_spans_round_trip_into_a_chrome_trace(tmp_path):
    a, b = Timeline(tmp_path / "a.jsonl", peer="A"), Timeline(tmp_path / "b.jsonl", peer="B")
    a.record("inject", 100.0, 100.2, microbatch=0, stage=0)
    a.record("send_forward", 100.2, 100.5, microbatch=0, to="B")
    b.record("forward", 100.5, 100.6, microbatch=0, stage=1)
    b.record("commit", 101.0, 101.5, iteration=0)
    a.flush(), b.flush()
    with (tmp_path / "b.jsonl").open("a") as f:
        f.write('{"peer": "B", "kind": "forw')  # a peer killed mid-write
    spans = read_spans([tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "missing.jsonl"])
    assert len(spans) == 4
    trace = chrome_trace(spans, {"A": "peer-00 (stage 0)", "B": "peer-01 (stage 1)"})
    json.dumps(trace)  # serialisable as is
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in ops] == [
        ("inject mb0", 0.0, 200000.0), ("send_forward mb0", 200000.0, 300000.0), ("forward mb0", 500000.0, 100000.0),
        ("commit", 1000000.0, 500000.0)]
    assert [e["tid"] for e in ops] == [0, 1, 0, 2]  # compute, send, sync rows
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "peer-00 (stage 0)", 1: "peer-01 (stage 1)"}
    assert ops[0]["pid"] == 0 and ops[2]["pid"] == 1


def test_a_timeline_without_a_path_records_nothing(tmp_path):
    t = Timeline(None, peer="A")
    t.record("forward", 0.0, 1.0)
    t.flush()
    assert not t.enabled and list(tmp_path.iterdir()) == []
