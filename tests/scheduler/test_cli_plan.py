"""The plan/simulate CLI as a user runs it: JSON on stdout, one-line errors and non-zero exits on bad input."""

import json

import pytest
from click.testing import CliRunner

from swarm.cli.main import main
from tests.scheduler.conftest import ASSETS


def run(args):
    return CliRunner().invoke(main, args)


def test_plan_then_simulate_json(tmp_path):
    out = tmp_path / "s.json"
    r = run(["plan", "--profile", "geo-distributed", "--peers", "20", "--stages", "6", "--skip", "0.33",
             "--iterations", "100", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["schedule"] == str(out) and report["plan_seconds"] > 0
    png = tmp_path / "g.png"
    r = run(["simulate", str(out), "--gantt", str(png), "--json"])
    assert r.exit_code == 0, r.output
    sim = json.loads(r.output)
    assert sim["iteration_seconds"] == pytest.approx(report["iteration_seconds"])
    assert sim["iteration_seconds"] < sim["baselines"]["full_pipeline"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_from_reference_instance(tmp_path):
    out = tmp_path / "r.json"
    r = run(["plan", "--instance", str(ASSETS / "reference-geo20.json"), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["microbatches"] == 30


@pytest.mark.parametrize("args, message", [
    (["plan", "--profile", "geo-distributed", "--peers", "3", "--stages", "6"], "cannot serve 6 stages"),
    (["plan", "--profile", "mars", "--peers", "3", "--stages", "2"], "unknown profile"),
    (["plan", "--profile", "random", "--peers", "8", "--stages", "4", "--memory", "0"], "--memory must be >= 1"),
    (["plan", "--profile", "random", "--peers", "8", "--stages", "4", "--skip", "1.5"], "--skip must be in"),
    (["plan", "--instance", "/nonexistent.json"], "cannot read instance"),
])
def test_bad_input_is_one_line_and_non_zero(tmp_path, args, message):
    r = run(args + ["-o", str(tmp_path / "x.json")])
    assert r.exit_code != 0
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_bad_instance_and_schedule_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"link_seconds": [[0, -1], [1, 0]], "forward_seconds": 1, "partitions": [[0], [1]],
                               "microbatches_per_data_node": 1, "stages_per_path": 2}))
    r = run(["plan", "--instance", str(bad), "-o", str(tmp_path / "x.json")])
    assert r.exit_code != 0 and "link_seconds" in r.output
    garbage = tmp_path / "g.json"
    garbage.write_text("{]")
    r = run(["simulate", str(garbage)])
    assert r.exit_code != 0 and "not valid JSON" in r.output and "Traceback" not in r.output


def test_scheduler_imports_no_torch_or_networking():
    import subprocess
    import sys

    code = ("import sys, scheduler.planner, scheduler.gantt, scheduler.instance;"
            "bad = [m for m in ('torch', 'hivemind', 'libp2p', 'peers', 'swarm') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
