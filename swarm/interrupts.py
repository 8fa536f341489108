"""`deferred_interrupts`: clean-up that a second Ctrl+C cannot cut short.

A user who presses Ctrl+C again while a launcher stops its processes (or deletes its network namespaces)
would otherwise leave them orphaned. Inside the block, SIGINT is remembered instead of raised; it is raised
once the block is done. Only the main thread can set signal handlers; elsewhere the block runs as is.
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
    if received:
        raise KeyboardInterrupt
