"""`skippipe demo`: the README's main job.

Plans the paper's 20-peer geo-distributed setting, shows its simulated iteration next to the baselines
with a Gantt chart, then trains the tiny model on the bundled corpus with a live progress display.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click


@click.command()
@click.option("--out", type=click.Path(file_okay=False), default="runs/demo", show_default=True,
              help="where the schedule, chart and metrics go")
@click.option("--iterations", type=int, default=30, show_default=True, help="training iterations")
def demo(out: str, iterations: int) -> None:
    """Plan, simulate and train: SkipPipe end to end on this machine."""
    from click.testing import CliRunner

    from swarm.cli import main

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    schedule = outdir / "geo20-schedule.json"
    runner = CliRunner()
    click.echo("== planning the paper's 20-peer geo-distributed swarm (6 stages, 33% skip)")
    for args in (["plan", "--profile", "geo-distributed", "--peers", "20", "--stages", "6", "--skip", "0.33",
                  "-o", str(schedule)],
                 ["simulate", str(schedule), "--gantt", str(outdir / "geo20-gantt.png")]):
        result = runner.invoke(main, args)
        click.echo(result.output.rstrip())
        if result.exit_code != 0:
            raise SystemExit(result.exit_code)
    if importlib.util.find_spec("swarm.cli_train") is None:
        click.echo("(training commands are not installed in this build)")
        return
    click.echo("== training the tiny model on the bundled corpus (in-process swarm, 6 peers, 3 stages, skip 0.33)")
    from swarm.cli_train import swarm as swarm_group

    swarm_group.main(["inprocess", "--model", "tiny", "--peers", "6", "--stages", "3", "--skip", "0.33",
                      "--iterations", str(iterations), "--metrics", str(outdir / "metrics.jsonl")],
                     standalone_mode=False)
