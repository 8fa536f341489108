"""A volunteer's console: one line per iteration saying what this peer did, whatever the logs do.

The line goes to the ``skippipe.console`` logger; `install_console` (``skippipe-peer join``) prints that logger
to stdout and keeps it out of the log file, so ``--log-file`` moves the log records away and the console keeps
its one line per iteration::

    iteration 12  stage 1  served 5 microbatches (fwd 5 / bwd 5)  compute 41% of 0.62 s  1,234 tokens/s  epoch 0
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TextIO

console_logger = logging.getLogger("skippipe.console")


@dataclass(frozen=True)
class IterationSummary:
    """What this peer did in one iteration."""

    iteration: int
    stage: int
    epoch: int
    forwards: int
    """Forward passes it ran (a data holder's injections included)."""
    backwards: int
    compute_seconds: float
    """Seconds it spent computing (forward, loss, backward), out of `seconds`."""
    seconds: float
    """Wall-clock seconds of its whole iteration: pipeline, commit, averaging, step."""
    tokens: int
    """Tokens its forward passes carried."""


def iteration_line(s: IterationSummary) -> str:
    """The console line of `s` (see the module docstring)."""
    share = s.compute_seconds / s.seconds if s.seconds > 0 else 0.0
    rate = s.tokens / s.seconds if s.seconds > 0 else 0.0
    served = max(s.forwards, s.backwards)
    return (f"iteration {s.iteration}  stage {s.stage}  served {served} microbatch{'es' if served != 1 else ''} "
            f"(fwd {s.forwards} / bwd {s.backwards})  compute {min(share, 1.0):.0%} of {s.seconds:.2f} s  "
            f"{rate:,.0f} tokens/s  epoch {s.epoch}")


def install_console(stream: TextIO | None = None) -> None:
    """Print the console lines to `stream` (stdout) only: not to the log file, not twice on stderr."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    console_logger.handlers[:] = [handler]
    console_logger.setLevel(logging.INFO)
    console_logger.propagate = False
