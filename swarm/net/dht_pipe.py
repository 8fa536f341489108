"""`make_commands_safe`: hivemind's DHT process reads its command pipe whole, whatever the command's size.

A hivemind DHT runs in a process of its own and takes each call (`store`, `get`, ...) from a pipe that its event
loop reads in non-blocking mode: a command too large to be in the pipe at once when the read starts (a value of
16 KiB already, sometimes) makes the read fail half-way, and the DHT process dies of the unpickling error that
follows. A run's schedules are tens of KiB at 20-40 peers. Setting the DHT's end of the pipe blocking (from inside
the DHT, before any large command) makes each read wait for the rest of its command, which the caller is writing.
"""

from __future__ import annotations

import os

from hivemind import DHT

_TIMEOUT = 10.0


async def _set_blocking(dht: DHT, node: object) -> bool:  # noqa: ARG001 - runs in the DHT process
    fd = dht._inner_pipe.fileno()
    os.set_blocking(fd, True)
    return os.get_blocking(fd)


def make_commands_safe(dht: DHT) -> None:
    """Make `dht` (started) read each command whole; raises RuntimeError if it could not."""
    if not dht.run_coroutine(_set_blocking, return_future=True).result(timeout=_TIMEOUT):
        raise RuntimeError("could not make the DHT's command pipe blocking")
