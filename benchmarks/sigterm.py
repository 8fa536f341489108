"""`unwind_on_sigterm`: a benchmark stopped by `timeout` or `kill` stops the swarms it started.

Python's default answer to SIGTERM ends the process at once, without running `finally` blocks, so the local swarm a
benchmark started (coordinator, peers, their p2p daemons and sidecars) would live on, orphaned. Raising SystemExit
instead unwinds the stack through `LocalSwarm.stop` and the like.
"""

from __future__ import annotations

import signal
import sys


def unwind_on_sigterm() -> None:
    """From now on, SIGTERM raises SystemExit in the main thread (call it from there)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("error: terminated (SIGTERM); stopping what was started"))
