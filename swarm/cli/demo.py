"""`skippipe demo`: the README's main job.

Plans the paper's 20-peer geo-distributed setting and shows its simulated iteration next to the baselines
(with a Gantt chart), then starts a real local swarm (a coordinator and 6 peer processes on loopback, each
with its own DHT node, p2pd and gossip sidecar) that trains the tiny model on the bundled corpus with a
live progress display.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--out", type=click.Path(file_okay=False), default="runs/demo", show_default=True,
              help="where the schedule, chart, logs and metrics go")
@click.option("--peers", type=click.IntRange(3, 32), default=6, show_default=True, help="peers of the local swarm")
@click.option("--iterations", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="training iterations")
def demo(out: str, peers: int, iterations: int) -> None:
    """Plan, simulate, then train a local swarm: SkipPipe end to end on this machine."""
    from click.testing import CliRunner

    from swarm.cli.main import main

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    schedule = outdir / "geo20-schedule.json"
    runner = CliRunner()
    click.echo("== 1. planning the paper's 20-peer geo-distributed swarm (6 stages, 33% skip)")
    for args in (["plan", "--profile", "geo-distributed", "--peers", "20", "--stages", "6", "--skip", "0.33",
                  "-o", str(schedule)],
                 ["simulate", str(schedule), "--gantt", str(outdir / "geo20-gantt.png")]):
        result = runner.invoke(main, args)
        click.echo(result.output.rstrip())
        if result.exit_code != 0:
            raise SystemExit(result.exit_code)
    click.echo(f"== 2. training the tiny model on the bundled corpus: a local swarm of {peers} peers "
               "(3 stages, 33% skip)")
    main.main(["swarm", "local", "--peers", str(peers), "--stages", "3", "--skip", "0.33",
               "--iterations", str(iterations), "--run-dir", str(outdir / "swarm"),
               "--metrics", str(outdir / "metrics.jsonl")], standalone_mode=False)
    click.echo(f"metrics: {outdir / 'metrics.jsonl'}; logs: {outdir / 'swarm'}")
