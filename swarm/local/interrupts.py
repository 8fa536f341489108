"""`deferred_interrupts`: clean-up that a second Ctrl+C cannot cut short.

A user who presses Ctrl+C again while a launcher stops its processes (or deletes its network namespaces)
would otherwise leave them orphaned. Inside the block, SIGINT is remembered instead of handled; once the
block is done it goes to the handler that was in place (KeyboardInterrupt by default; nothing if SIGINT was
ignored). Only the main thread can set signal handlers; elsewhere the block runs as is.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if not received or previous in (signal.SIG_IGN, None):
        return  # a process that ignores SIGINT (started in the background) goes on ignoring it
    if callable(previous):
        previous(signal.SIGINT, None)  # default_int_handler raises KeyboardInterrupt
    else:
        raise KeyboardInterrupt
