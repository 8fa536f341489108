"""A peer whose DHT is not up `STARTUP_STACKS_AFTER` seconds after it started writes every thread's stack to its
standard error, once.

A joiner that hangs before its DHT is up says nothing else: the DHT readiness timeout (`Node.start_dht`) covers only
the wait for the DHT process, not what comes before it (the reaper's start, the fork). `faulthandler` dumps from a
thread of its own, which needs neither the GIL nor any lock the hung threads may hold, so it speaks whatever the
rest of the process is stuck in.
"""

from __future__ import annotations

import faulthandler
import io

STARTUP_STACKS_AFTER = 60.0
"""Seconds a peer may take from its start to its DHT being up before it dumps its stacks (joiners on a loaded
2-core host took 3-11 s)."""


def watch_startup(seconds: float = STARTUP_STACKS_AFTER) -> None:
    """Dump every thread's stack to stderr in `seconds` unless `started` comes first. Nothing where stderr has no
    file descriptor (a test runner's captured stream): faulthandler writes to a descriptor."""
    try:
        faulthandler.dump_traceback_later(seconds, repeat=False, exit=False)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return


def started() -> None:
    """The DHT is up: no dump."""
    faulthandler.cancel_dump_traceback_later()
