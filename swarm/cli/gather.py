"""`skippipe gather`: the peers' own stage checkpoints of a networked run -> one whole-model checkpoint.

The work is `peers.checkpoint_gather`; this command parses flags, calls it, says which iteration it chose and
where each stage came from, and turns every refusal into one line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


class GatherRefused(click.ClickException):
    """Peer checkpoints that cannot be gathered: one line on stderr, exit code 2 (as a usage error)."""

    exit_code = 2


def report_gathered(result: Any) -> None:
    """Print a `GatherResult`: the iteration chosen, each stage's source, and any warning (on stderr)."""
    for line in result.warnings:
        click.echo(f"warning: {line}", err=True)
    click.echo(f"gathered iteration {result.iteration} of {len(result.sources)} stages into "
               f"{result.manifest_path.parent}" + ("" if result.optimizer else " (weights only: a stage had no "
                                                    "optimizer state)"))
    for s, c in sorted(result.sources.items()):
        agree, total = result.agreeing[s]
        click.echo(f"  stage {s}: {c.describe()}" + (f", {agree} of {total} agree" if total > 1 else ""))


def gather_into(dirs: tuple[Path, ...], output: Path, tokenizer: Path | None) -> Any:
    """Gather `dirs` into `output`, reporting it; every refusal is a GatherRefused."""
    from peers.checkpoint_gather import gather_checkpoint

    try:
        result = gather_checkpoint(dirs, output, tokenizer=tokenizer)
    except (ValueError, OSError) as e:
        raise GatherRefused(str(e)) from None
    report_gathered(result)
    return result


@click.command("gather")
@click.argument("peer_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("more_dirs", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="New or empty checkpoint directory to write.")
@click.option("--tokenizer", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="tokenizer.json to store with it (default: the run's data.tokenizer, if the file is here).")
def gather_command(peer_dir: Path, more_dirs: tuple[Path, ...], output: Path, tokenizer: Path | None) -> None:
    """Gather peers' --checkpoint-dir directories (or one directory holding them) into one whole-model
    checkpoint at the newest iteration every stage has, for `skippipe eval` and `skippipe export-hf`."""
    result = gather_into((peer_dir, *more_dirs), output, tokenizer)
    if not result.tokenizer:
        click.echo("no tokenizer stored: `skippipe eval` needs one (--tokenizer FILE)")
