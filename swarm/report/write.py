"""`write_report`: a run directory in, the report's PNGs and its one-page HTML out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from swarm.report.page import render_page
from swarm.report.plots import (
    plot_busy_idle,
    plot_gantt,
    plot_iteration_time,
    plot_loss,
    plot_planned_gantt,
    plot_tokens,
)
from swarm.report.run_dir import RunData, read_run
from swarm.report.summary import summarize
from swarm.report.traces import Traces, read_traces

PAGE = "report.html"
NO_TIMELINES = ("no peer timelines (NAME.trace.jsonl) in the run directory: start peers with `skippipe-peer join "
                "--trace RUN_DIR/peer-NN.trace.jsonl` for the busy/idle plot and the measured Gantt")


class ReportError(ValueError):
    """A report option does not fit the run (e.g. --iteration of an iteration without timelines)."""


@dataclass
class Report:
    """What `write_report` wrote and what it had to leave out."""

    page: Path
    plots: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What was skipped while reading the run directory (malformed lines, unreadable files)."""
    notes: list[str] = field(default_factory=list)
    """Plots left out, and why."""
    gantt_iteration: int | None = None


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, *, iteration: int | None = None) -> Report:
    """Read the run at `run_dir` and write its report into `out_dir` (default RUN_DIR/report).

    :param iteration: the (1-based) iteration drawn as a measured Gantt; default the last complete one
    :raises NotARunError: `run_dir` is not a run directory
    :raises ReportError: `iteration` has no timeline spans; `out_dir` cannot be written
    """
    run = read_run(run_dir)
    traces = read_traces(run.path)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create the output directory {out}: {e.strerror or e}") from None
    report = Report(page=out / PAGE, warnings=run.warnings + traces.warnings)
    chosen = gantt_iteration(run, traces, iteration)
    plots: list[tuple[str, Path]] = []
    try:
        plots.append(("Loss", plot_loss(run, out / "loss.png")))
        plots.append(("Tokens per second", plot_tokens(run, out / "tokens_per_s.png")))
        plots.append(("Iteration time, measured vs planned", plot_iteration_time(run, out / "iteration_time.png")))
        if not run.schedules:
            report.notes.append("no schedule-N.json in the run directory: no planned iteration times")
        busy = plot_busy_idle(run, traces, out / "busy_idle.png")
        if busy is not None:
            plots.append(("Per-peer busy / idle", busy))
        if chosen is not None:
            report.gantt_iteration = chosen
            spans = traces.spans_of(chosen - 1)
            plots.append((f"Measured Gantt of iteration {chosen}",
                          plot_gantt(run, traces, chosen, spans, out / "gantt_measured.png")))
            epoch = next((r.epoch for r in run.metrics if r.iteration == chosen), None)
            planned = plot_planned_gantt(run, epoch, out / "gantt_planned.png") if epoch is not None else None
            if planned is not None:
                plots.append((f"Planned Gantt of schedule epoch {epoch} (simulated)", planned))
        if not traces.files or not traces.iterations:
            report.notes.append(NO_TIMELINES)
        report.plots = [p for _, p in plots]
        title = f"skippipe run {run.run_id}" if run.run_id else f"skippipe run in {run.path.name}"
        report.page.write_text(render_page(title, summarize(run, traces), plots, report.notes, report.warnings))
    except OSError as e:
        raise ReportError(f"cannot write the report into {out}: {e.strerror or e}") from None
    return report


def gantt_iteration(run: RunData, traces: Traces, wanted: int | None) -> int | None:
    """The iteration (1-based) to draw as a measured Gantt: `wanted`, checked, or the last committed iteration
    in which every traced peer of its epoch recorded spans (None if no iteration has spans)."""
    with_spans = {i + 1 for i in traces.iterations}
    if wanted is not None:
        if wanted not in with_spans:
            where = f"timelines cover iterations {min(with_spans)}–{max(with_spans)}" if with_spans else \
                "the run has no peer timelines"
            raise ReportError(f"--iteration {wanted}: no timeline spans of that iteration ({where})")
        return wanted
    traced = traces.peers
    committed = sorted((r for r in run.metrics if r.iteration in with_spans), key=lambda r: -r.iteration)
    for record in committed:
        schedule = run.schedules.get(record.epoch) if record.epoch is not None else None
        expected = set(schedule.placement) & traced if schedule is not None else set()
        if expected <= traces.peers_in(record.iteration - 1):
            return record.iteration
    if committed:
        return committed[0].iteration
    return max(with_spans) if with_spans else None
