"""`skippipe report RUN_DIR`: plots and a one-page HTML report of a run directory."""

from __future__ import annotations

from pathlib import Path

import click


class ReportFailed(click.ClickException):
    """Bad input (not a run directory, an iteration without timelines): one line, exit code 2."""

    exit_code = 2


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where to write the PNGs and report.html  [default: RUN_DIR/report]")
@click.option("--iteration", type=click.IntRange(1, 1 << 62), default=None,
              help="iteration to draw as a measured Gantt  [default: the last complete one]")
def report(run_dir: Path, out_dir: Path | None, iteration: int | None) -> None:
    """Plot a run's loss, tokens/s, iteration time (measured vs planned), per-peer busy/idle and a measured Gantt,
    and write them with a summary table as one self-contained HTML page."""
    from swarm.report.run_dir import NotARunError
    from swarm.report.write import ReportError, write_report

    try:
        written = write_report(run_dir, out_dir, iteration=iteration)
    except (NotARunError, ReportError) as e:
        raise ReportFailed(str(e)) from None
    for warning in written.warnings:
        click.echo(f"warning: {warning}", err=True)
    for note in written.notes:
        click.echo(f"note: {note}", err=True)
    for path in [*written.plots, written.page]:
        click.echo(str(path))
