"""Every command the README shows is one the code accepts: `make` targets that exist, and `skippipe` /
`skippipe-peer` subcommands with flags their click commands define. (What they do is tested where the code is:
`make test` is CI itself, `make demo` and `swarm local` by the local-swarm tests, `plan`/`simulate` by the CLI
tests, `monitor`, `report`, `coordinator start` and `join` by their own end-to-end tests.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from swarm.cli.main import main, peer_main

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The commands in the README's bash blocks, continuation lines joined and comments dropped."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def resolve(words: list[str]) -> tuple[click.Command, list[str], str]:
    """The click command a `skippipe ...` line runs, the arguments it gets, and its name."""
    program = Path(words[0]).name
    command: click.Command = {"skippipe": main, "skippipe-peer": peer_main}[program]
    args, name = words[1:], program
    while isinstance(command, click.Group):
        ctx = click.Context(command, info_name=name)
        sub = command.get_command(ctx, args[0]) if args else None
        assert sub is not None, f"`{' '.join(words)}`: {program} has no command {args[:1]}"
        command, name, args = sub, f"{name} {args[0]}", args[1:]
    return command, args, name


def test_the_readme_shows_commands():
    assert any(c.startswith("make demo") for c in readme_commands())
    assert sum("skippipe" in c for c in readme_commands()) >= 8


@pytest.mark.parametrize("line", readme_commands())
def test_a_readme_command_is_accepted(line):
    words = shlex.split(line)
    if words[0] == "make":
        targets = re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), flags=re.M)
        assert set(words[1:]) <= set(targets), f"`{line}`: no such make target"
        return
    assert Path(words[0]).name in ("skippipe", "skippipe-peer"), f"`{line}`: not a skippipe command"
    command, args, name = resolve(words)
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}
    unknown = [a.split("=", 1)[0] for a in args if a.startswith("-") and a.split("=", 1)[0] not in known]
    assert not unknown, f"`{line}`: {name} has no option {unknown}"
    ctx = click.Context(command, info_name=name)
    raw, _, _ = command.make_parser(ctx).parse_args(list(args))  # as typed: paths a reader would create need not exist
    arguments = [p for p in command.params if isinstance(p, click.Argument) and p.required]
    assert all(isinstance(raw.get(p.name), str) for p in arguments), f"`{line}`: a required argument is missing"
