"""`skippipe report` on a run directory written by the project's own writers: every plot and the page, through the
command line; the page embeds every plot and states the summary; --iteration picks the Gantt's iteration."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from swarm.cli.main import main
from swarm.report.write import write_report

PNG = b"\x89PNG\r\n\x1a\n"
PLOTS = ["loss.png", "tokens_per_s.png", "iteration_time.png", "busy_idle.png", "gantt_measured.png",
         "gantt_planned.png"]


def test_the_report_writes_every_plot_and_a_page_that_embeds_them(fixture_run, tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["report", str(fixture_run), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout.split() == [str(out / name) for name in PLOTS] + [str(out / "report.html")]
    assert "peer-05.trace.jsonl: 1 of" in r.stderr  # the dead peer's torn line, skipped and said
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
    page = (out / "report.html").read_text()
    for name in PLOTS:
        assert f"href='{name}'" in page
        assert base64.b64encode((out / name).read_bytes()).decode() in page  # embedded: the page stands alone
    assert "http://" not in page and "https://" not in page and "<script" not in page
    metrics = [json.loads(line) for line in (fixture_run / "metrics.jsonl").read_text().splitlines()]
    for text in ("fixture-run", "3 (2 per path, skip ratio 0.33)", "6 placed in a schedule",
                 f"{metrics[-1]['loss']:.4f} at iteration 6", "2 published", "epochs 0, 1", "1 re-plan ",
                 "Measured Gantt of iteration 6", "Planned Gantt of schedule epoch 1"):
        assert text in page, text
    assert "<td>peers declared gone</td><td>peer-05</td>" in page


def test_the_default_output_is_beside_the_run_and_the_gantt_iteration_can_be_chosen(fixture_run, tmp_path):
    run = shutil.copytree(fixture_run, tmp_path / "run")
    report = write_report(run, iteration=2)
    assert report.page == run / "report" / "report.html" and report.gantt_iteration == 2
    assert "Measured Gantt of iteration 2<" in report.page.read_text()
    assert write_report(run).gantt_iteration == 6  # the last complete one


def test_an_iteration_without_timelines_is_refused_with_exit_code_2(fixture_run, tmp_path):
    r = CliRunner().invoke(main, ["report", str(fixture_run), "-o", str(tmp_path), "--iteration", "40"])
    assert r.exit_code == 2 and "--iteration 40: no timeline spans" in r.output and "1–6" in r.output
    assert "Traceback" not in r.output


def test_a_run_without_timelines_reports_what_it_can_and_says_why_the_rest_is_missing(fixture_run, tmp_path):
    run = shutil.copytree(fixture_run, tmp_path / "run", ignore=shutil.ignore_patterns("*.trace.jsonl"))
    report = write_report(run)
    assert [p.name for p in report.plots] == PLOTS[:3]
    assert report.gantt_iteration is None and any("--trace" in n for n in report.notes)
    assert "--trace" in report.page.read_text()


def test_the_report_imports_neither_hivemind_nor_torch():
    code = ("import sys; import swarm.cli.report, swarm.report.write; "
            "print(sorted(m for m in ('hivemind', 'libp2p', 'torch', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("hostile", ["<script>alert(1)</script>", "peer' onerror='x"])
def test_text_from_the_run_is_escaped_in_the_page(fixture_run, tmp_path, hostile):
    run = shutil.copytree(fixture_run, tmp_path / "run")
    with (run / "coordinator.events.jsonl").open("a") as f:
        f.write(json.dumps({"time": 1.0, "node": "x", "event": "declared_gone", "peer": hostile, "why": "x"}) + "\n")
    page = write_report(run).page.read_text()
    assert hostile not in page and "alert(1)" not in page.replace("&lt;script&gt;alert(1)", "")
