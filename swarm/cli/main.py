"""The `skippipe` and `skippipe-peer` commands.

Each subcommand lives in its own module and is imported only when it runs, so `skippipe plan` does not
pay for importing torch or hivemind. Bad input ends with a one-line error and a non-zero exit.
"""

from __future__ import annotations

import importlib

import click

COMMANDS = {
    "plan": "swarm.cli.plan:plan_command",
    "simulate": "swarm.cli.plan:simulate_command",
    "demo": "swarm.cli.demo:demo",
    "swarm": "swarm.cli.train:swarm",
    "eval": "swarm.cli.train:eval_command",
    "coordinator": "swarm.cli.run:coordinator",
    "import-hf": "swarm.cli.hf:import_hf_command",
    "export-hf": "swarm.cli.hf:export_hf_command",
    "gather": "swarm.cli.gather:gather_command",
    "monitor": "swarm.cli.monitor:monitor",
    "report": "swarm.cli.report:report",
}
"""Subcommand name -> "module:attribute" of its click command."""

PEER_COMMANDS: dict[str, str] = {
    "join": "swarm.cli.run:join",
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand is used."""

    def __init__(self, *args, lazy: dict[str, str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "swarm":  # the group gains `local` from swarm.cli.run
            importlib.import_module("swarm.cli.run")
        if name in self.lazy:
            module, attr = self.lazy[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, lazy=COMMANDS)
def main() -> None:
    """skippipe: partial and reordered pipeline-parallel training over volunteer peers."""


@click.group(cls=LazyGroup, lazy=PEER_COMMANDS)
def peer_main() -> None:
    """skippipe-peer: join a skippipe run as a volunteer peer."""
