"""Reading a run directory: what is not a run is refused in one line (exit code 2); malformed lines and files are
skipped, counted and reported, never raised."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from swarm.cli.main import main
from swarm.report.json_lines import MAX_LINE_BYTES
from swarm.report.run_dir import NotARunError, committed_records, read_run
from swarm.report.write import write_report


def _not_a_run(d, kind: str):
    if kind == "missing":
        return d / "missing"
    if kind == "file":
        (d / "f.txt").write_text("x")
        return d / "f.txt"
    if kind == "metrics is a directory":
        (d / "metrics.jsonl").mkdir()
    elif kind == "garbage metrics":
        (d / "metrics.jsonl").write_text("garbage\n[1]\n")
    elif kind == "empty metrics":
        (d / "metrics.jsonl").write_text("")
    return d


@pytest.mark.parametrize("kind, message", [
    ("empty", "is not a run directory: it has no metrics.jsonl"),
    ("missing", "no such directory"),
    ("file", "is a file, not a run directory"),
    ("metrics is a directory", "it has no metrics.jsonl"),
    ("garbage metrics", "holds no valid iteration record (2 lines, 2 malformed)"),
    ("empty metrics", "holds no valid iteration record (0 lines"),
])
def test_a_directory_that_is_not_a_run_is_refused_in_one_line_with_exit_code_2(tmp_path, kind, message):
    path = _not_a_run(tmp_path, kind)
    with pytest.raises(NotARunError) as e:
        read_run(path)
    assert message in str(e.value)
    r = CliRunner().invoke(main, ["report", str(path)])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_a_fifo_named_metrics_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "metrics.jsonl")  # opening it would block forever
    with pytest.raises(NotARunError, match="it has no metrics.jsonl"):
        read_run(tmp_path)


def test_malformed_metrics_lines_are_skipped_counted_and_reported(fixture_run, tmp_path):
    run = shutil.copytree(fixture_run, tmp_path / "run")
    good = (run / "metrics.jsonl").read_text().splitlines()
    bad = [
        "not json",
        "[1, 2]",
        json.dumps({"iteration": True, "loss": 1.0}),  # a bool is not an iteration
        json.dumps({"iteration": 3, "loss": "low"}),
        json.dumps({"iteration": -1, "loss": 1.0}),
        '{"iteration": 4, "loss": NaN}',
        json.dumps({"iteration": 5, "loss": 1.0, "epoch": 1.5}),
        "[" * 100_000,  # deeper than the parser's recursion limit
        "x" * (MAX_LINE_BYTES + 10),  # longer than any line of ours
    ]
    lines = good[:2] + bad + good[2:]
    (run / "metrics.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe{}\n" + b'{"iteration": 7')
    data = read_run(run)
    assert [r.iteration for r in data.metrics] == [1, 2, 3, 4, 5, 6]
    assert f"metrics.jsonl: 11 of {len(good) + 11} lines skipped (malformed)" in data.warnings
    r = CliRunner().invoke(main, ["report", str(run), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0 and "warning: metrics.jsonl: 11 of" in r.stderr
    assert "metrics.jsonl: 11 of" in (tmp_path / "out" / "report.html").read_text()


def test_an_iteration_recorded_twice_keeps_the_last_record(fixture_run, tmp_path):
    run = shutil.copytree(fixture_run, tmp_path / "run")
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"iteration": 6, "loss": 1.25, "epoch": 1}) + "\n")
    data = read_run(run)
    assert data.metrics[-1].loss == 1.25 and len(data.metrics) == 6
    assert any("superseded by a later record" in w for w in data.warnings)


def test_a_rerun_iteration_replaces_the_records_it_supersedes():
    written = [{"iteration": 36, "epoch": 3}, {"iteration": 37, "epoch": 4}, {"iteration": 37, "epoch": 5},
               {"iteration": 38, "epoch": 5}]
    assert committed_records(written) == [{"iteration": 36, "epoch": 3}, {"iteration": 37, "epoch": 5},
                                          {"iteration": 38, "epoch": 5}]
    in_order = [{"iteration": i, "epoch": 0} for i in range(1, 5)]
    assert committed_records(in_order) == in_order


def test_a_stale_schedulers_late_record_is_dropped():
    # the coordinator froze as it committed iteration 4 (epoch 0); its successor reran 4 and 5 under epoch 1; thawed,
    # the coordinator wrote its commit of 4 down: the successor's records stand
    written = [{"iteration": i, "epoch": 0} for i in range(1, 4)] + \
        [{"iteration": 4, "epoch": 1}, {"iteration": 5, "epoch": 1}, {"iteration": 4, "epoch": 0},
         {"iteration": 6, "epoch": 1}]
    assert [(r["iteration"], r["epoch"]) for r in committed_records(written)] == \
        [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1)]


@pytest.mark.parametrize("content", ["{", '{"version": 99}', "[]", "\udcff", '{"version": 1, "epoch": 0}'])
def test_a_broken_schedule_is_skipped_with_a_warning(fixture_run, tmp_path, content):
    run = shutil.copytree(fixture_run, tmp_path / "run")
    (run / "schedule-1.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    data = read_run(run)
    assert sorted(data.schedules) == [0]
    assert any(w.startswith("schedule-1.json: skipped, not a readable schedule") for w in data.warnings)
    assert write_report(run).page.exists()  # epoch 1's iterations just have no planned time


def test_a_schedule_file_holding_another_epoch_is_skipped(fixture_run, tmp_path):
    run = shutil.copytree(fixture_run, tmp_path / "run")
    (run / "schedule-7.json").write_text((run / "schedule-0.json").read_text())
    data = read_run(run)
    assert sorted(data.schedules) == [0, 1] and "schedule-7.json: skipped, it holds epoch 0" in data.warnings


def test_events_of_unknown_names_or_without_a_node_are_skipped(fixture_run, tmp_path):
    run = shutil.copytree(fixture_run, tmp_path / "run")
    with (run / "coordinator.events.jsonl").open("a") as f:
        f.write(json.dumps({"time": 1.0, "node": "c", "event": "made_up"}) + "\n")
        f.write(json.dumps({"time": 1.0, "event": "left"}) + "\n")
        f.write(json.dumps({"time": "noon", "node": "c", "event": "left"}) + "\n")
    data = read_run(run)
    assert "coordinator.events.jsonl: 3 of 5 lines skipped (malformed or unknown events)" in data.warnings
    assert [e["event"] for e in data.events if e["node"] == "coordinator-id"] == ["declared_gone", "replanned"]


def test_a_metrics_only_directory_gives_the_time_series(tmp_path):
    """What `skippipe swarm inprocess --metrics DIR/metrics.jsonl` writes: no schedules, events or timelines."""
    lines = [{"iteration": i, "loss": 9.0 - i, "tokens_per_s": 1000.0, "lr": 1e-3, "seconds": 0.5, "time": 1.0 + i}
             for i in range(1, 5)]
    lines[-1]["val_loss"] = 5.5
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    report = write_report(tmp_path)
    assert [p.name for p in report.plots] == ["loss.png", "tokens_per_s.png", "iteration_time.png"]
    page = report.page.read_text()
    assert "validation 5.5000 at iteration 4" in page and "unknown (no events recorded)" in page


@pytest.mark.parametrize(("toml", "model"), [('[run]\nmodel = "small"\n', "small"), ("[run]\nstages = 3\n", "tiny"),
                                             ("[run]\nstages = 2\n[model]\ndim = 64\n", "custom")])
def test_the_model_is_named_from_the_runs_config(tmp_path, toml, model):
    """A flavor by name, the default when none is given, or `custom` for an explicit [model] table (import-hf)."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"iteration": 1, "loss": 8.0, "time": 1.0}) + "\n")
    (tmp_path / "run.toml").write_text(toml)
    assert read_run(tmp_path).model == model
