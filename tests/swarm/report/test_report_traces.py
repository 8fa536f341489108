"""Timelines, as `Timeline` writes them, read back per iteration: windows, busy/averaging/idle seconds, one
iteration's spans; malformed spans skipped and counted."""

from __future__ import annotations

import json

import pytest

from swarm.peer.timeline import Timeline
from swarm.report.traces import read_traces, span_of


def write_two_peers(run_dir):
    a = Timeline(run_dir / "peer-00.trace.jsonl", peer="A")
    b = Timeline(run_dir / "peer-01.trace.jsonl", peer="B")
    # iteration 0: window [100, 110]; A computes 0-4 and 3-5 (overlapping: 5 s), averages 8-10; B computes 2-6
    a.record("inject", 100.0, 104.0, microbatch=0, stage=0, iteration=0)
    a.record("backward", 103.0, 105.0, microbatch=0, stage=0, iteration=0)
    a.record("send_forward", 104.0, 104.5, to="B", microbatch=0, iteration=0)
    a.record("commit", 105.0, 108.0, iteration=0)
    a.record("average", 108.0, 110.0, iteration=0)
    b.record("forward", 102.0, 106.0, microbatch=0, stage=1, iteration=0)
    b.record("average", 108.0, 109.0, iteration=0)
    # iteration 1: only A, window [120, 121]
    a.record("loss", 120.0, 121.0, microbatch=1, stage=0, iteration=1)
    a.flush()
    b.flush()


def test_busy_averaging_and_idle_seconds_per_peer(tmp_path):
    write_two_peers(tmp_path)
    traces = read_traces(tmp_path)
    assert traces.iterations == [0, 1] and traces.window(0) == (100.0, 110.0) and traces.window(1) == (120.0, 121.0)
    assert traces.names == {"A": "peer-00", "B": "peer-01"} and traces.stages == {"A": 0, "B": 1}
    times = traces.peer_times()
    assert (times["A"].compute, times["A"].average, times["A"].window, times["A"].iterations) == (6.0, 2.0, 11.0, 2)
    assert times["A"].idle == pytest.approx(3.0)
    assert (times["B"].compute, times["B"].average, times["B"].window, times["B"].iterations) == (4.0, 1.0, 10.0, 1)
    assert [s.kind for s in traces.spans_of(0)] == ["inject", "forward", "backward", "send_forward", "commit",
                                                    "average", "average"]
    assert traces.peers_in(1) == {"A"} and traces.warnings == []


def test_malformed_spans_are_skipped_and_counted(tmp_path):
    write_two_peers(tmp_path)
    bad = [{"peer": "A", "kind": "forward", "start": 5.0, "end": 4.0, "iteration": 0},  # ends before it starts
           {"peer": "A", "kind": "forward", "start": "0", "end": 1.0},
           {"peer": "A", "kind": "forward", "start": 0.0, "end": 1.0, "iteration": -1},
           {"peer": "A", "kind": "forward", "start": 0.0, "end": 1.0, "iteration": True},
           {"peer": 7, "kind": "forward", "start": 0.0, "end": 1.0},
           {"kind": "forward", "start": 0.0, "end": 1.0}]
    with (tmp_path / "peer-00.trace.jsonl").open("a") as f:
        f.writelines(json.dumps(b) + "\n" for b in bad)
        f.write('{"peer": "A", "kind": "forward", "start": Infinity, "end": Infinity}\n{"peer": "A", "ki')
    traces = read_traces(tmp_path)
    assert traces.warnings == ["peer-00.trace.jsonl: 8 of 14 lines skipped (malformed spans)"]
    assert traces.window(0) == (100.0, 110.0)


def test_a_span_without_an_iteration_counts_for_no_iteration():
    span = span_of({"peer": "A", "kind": "send_forward", "start": 1.0, "end": 2.0, "to": "B"})
    assert span is not None and span.iteration is None and span.microbatch is None


def test_a_run_without_timelines_has_no_iterations(tmp_path):
    traces = read_traces(tmp_path)
    assert traces.files == [] and traces.iterations == [] and traces.peer_times() == {}
