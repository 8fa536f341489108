"""`make_commands_safe`: hivemind's DHT process gets each command on its pipe whole, whatever its size and however
many of the caller's threads send at once.

A hivemind DHT runs in a process of its own and takes each call (`store`, `get`, ...) from a pipe, and both ends of
that pipe break a command that is not small:
- The DHT's event loop reads the pipe in non-blocking mode: a command too large to be in the pipe at once when the
  read starts (a value of 16 KiB already, sometimes) makes the read fail half-way, and the DHT process dies of the
  unpickling error that follows. Setting the DHT's end blocking (from inside the DHT, before any large command)
  makes each read wait for the rest of its command, which the caller is writing.
- The caller's end is a `multiprocessing` connection that writes a command over 16 KiB as two writes (and any over
  the pipe's atomic size in pieces), with no lock: two threads that send at once (a heartbeat, a records read, a
  schedule store, a schedule read) interleave their bytes, and the DHT process dies of the garbage it reads. Every
  later call of that process then times out: its scheduler reads no records and declares every peer gone (a churn
  benchmark run, 2026-12-05). The caller's end now sends one command at a time.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from hivemind import DHT

_TIMEOUT = 10.0


class _OneSendAtATime:
    """A connection whose `send` holds a lock: each command goes into the pipe whole before the next one starts.
    A process lock, not a thread lock: a hivemind averager forked from this process later sends on the same pipe."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._lock = multiprocessing.get_context("fork").Lock()

    def send(self, obj: Any) -> None:
        with self._lock:
            self._connection.send(obj)

    def __getattr__(self, name: str) -> Any:  # close, fileno, ...: the connection's own
        return getattr(self._connection, name)


async def _set_blocking(dht: DHT, node: object) -> bool:  # noqa: ARG001 - runs in the DHT process
    fd = dht._inner_pipe.fileno()
    os.set_blocking(fd, True)
    return os.get_blocking(fd)


def make_commands_safe(dht: DHT) -> None:
    """Make `dht` (started) get each command whole: its process reads each one to its end, and this process's
    threads send one at a time. Raises RuntimeError if it could not. Call it before any other thread uses `dht`."""
    if not isinstance(dht._outer_pipe, _OneSendAtATime):
        dht._outer_pipe = _OneSendAtATime(dht._outer_pipe)
    if not dht.run_coroutine(_set_blocking, return_future=True).result(timeout=_TIMEOUT):
        raise RuntimeError("could not make the DHT's command pipe blocking")
