"""`stop_event`: SIGINT / SIGTERM ask a long-running command to stop, and children forked later still die on SIGTERM.

The first signal sets an event the command's loops check (a peer finishes its iteration and leaves); a second one
raises KeyboardInterrupt. hivemind forks its DHT and averager from the command's process and stops a wedged one with
SIGTERM, which must end it, not set a copy of the parent's event: a fork hook gives such children Python's default
handlers back (hivemind's processes then ignore SIGINT on their own, so a Ctrl+C reaches the command alone).
"""

from __future__ import annotations

import os
import signal
import threading


def stop_event() -> threading.Event:
    """Install the stop handler for SIGINT and SIGTERM in this (main) thread; return the event it sets."""
    stop = threading.Event()

    def handler(signum, frame) -> None:  # noqa: ARG001
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    handler.sets_stop_event = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _default_signals_in_child() -> None:
    """Run in every child forked from this process: drop the stop handler, where it is installed."""
    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if getattr(signal.getsignal(signum), "sets_stop_event", False):
            signal.signal(signum, default)


os.register_at_fork(after_in_child=_default_signals_in_child)
