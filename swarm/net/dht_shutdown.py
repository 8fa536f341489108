"""Stopping a hivemind DHT without leaving its socket files (p2pd's, its client's) behind.

When a DHT does not finish its shutdown within its grace period (a request from a process that already exited can
wedge its loop), hivemind terminates it; its p2pd then dies without unlinking its unix socket, and the files pile up
in the temp dir. :func:`stop_dht` asks the DHT for its daemon's socket first and, once the DHT is gone, removes that
file if nothing listens on it any more. It only ever touches the socket of the DHT it is given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

from hivemind import DHT

from swarm.net.reaper import is_listened_on  # lives there (no hivemind) and is imported from here too

logger = logging.getLogger(__name__)

_ASK_TIMEOUT = 5.0
"""How long to wait for the DHT to name its daemon's socket (it may already be wedged)."""
_UNLINK_GRACE = 2.0
"""How long p2pd gets to remove its own socket after the DHT stopped."""


async def _socket_paths(dht: DHT, node: object) -> tuple[str | None, str | None]:  # noqa: ARG001 - in the DHT
    """The unix sockets of the DHT's p2pd and of its own p2p client (which its daemon hands streams to)."""
    p2p = node.p2p  # type: ignore[attr-defined]
    client = getattr(p2p, "_client_listen_maddr", None)  # hivemind keeps it private; None if it ever goes
    return p2p.daemon_listen_maddr.value_for_protocol("unix"), client.value_for_protocol("unix") if client else None


def socket_paths(dht: DHT) -> tuple[str | None, str | None]:
    """(daemon socket, client socket) of a running DHT, in one round trip; (None, None) if it does not answer."""
    if not dht.is_alive():
        return None, None
    try:
        return dht.run_coroutine(_socket_paths, return_future=True).result(timeout=_ASK_TIMEOUT)
    except Exception as e:  # a DHT that cannot answer is stopped all the same
        logger.debug("could not ask the DHT for its sockets: %s: %s", type(e).__name__, e)
        return None, None


def daemon_socket_path(dht: DHT) -> str | None:
    """The unix socket the DHT's p2pd listens on, or None if the DHT does not answer."""
    return socket_paths(dht)[0]


def stop_dht(dht: DHT) -> None:
    """Shut ``dht`` down; if its daemon or its client left a socket file behind, unlink it."""
    paths = [p for p in socket_paths(dht) if p]
    dht.shutdown()
    dht.join(_UNLINK_GRACE)  # after a hard terminate, hivemind does not wait for the process to end
    if not paths or dht.is_alive():
        return
    deadline = time.monotonic() + _UNLINK_GRACE
    while any(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.1)
    for path in paths:
        if os.path.exists(path) and not is_listened_on(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            logger.debug("removed the socket %s the DHT left behind", path)
