"""Stopping a hivemind DHT without leaving its socket files (p2pd's, its client's) behind.

When a DHT does not finish its shutdown within its grace period (a request from a process that already exited can
wedge its loop), hivemind terminates it; its p2pd then dies without unlinking its unix socket, and the files pile up
in the temp dir. :func:`stop_dht` asks the DHT for its daemon's socket first and, once the DHT is gone, removes that
file if nothing listens on it any more. It only ever touches the socket of the DHT it is given. A DHT that outlives
hivemind's hard terminate too (a SIGTERM handler it inherited, a wedged process) is killed with its helpers: the
caller started it, so the caller stops it. :func:`hung_dht_state` says what a DHT being stopped because it was not
ready in time was doing, for the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from pathlib import Path

import psutil
from hivemind import DHT

from swarm.net.reaper import is_listened_on, unix_socket_paths  # is_listened_on is imported from here too

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


def _helpers(dht: DHT) -> list[psutil.Process]:
    """The DHT process's descendants (its p2pd), collected while it lives: a killed DHT cannot name them."""
    try:
        return psutil.Process(dht.pid).children(recursive=True) if dht.is_alive() else []
    except psutil.Error:
        return []


def _listened_sockets(dht: DHT, helpers: list[psutil.Process]) -> set[str]:
    """hivemind's sockets the DHT and its helpers are bound to, read from /proc: a wedged DHT cannot name them."""
    pids = ([dht.pid] if dht.is_alive() else []) + [p.pid for p in helpers]
    return {path for pid in pids for path in unix_socket_paths(pid) if os.path.basename(path).startswith("hivemind-")}


def _end(dht: DHT, helpers: list[psutil.Process]) -> None:
    """Wait for the DHT to end, SIGKILL it if it outlived hivemind's terminate, and then its helpers that are still
    there (p2pd does not die with its parent when that parent is terminated or killed)."""
    dht.join(_UNLINK_GRACE)  # after a hard terminate, hivemind does not wait for the process to end
    if dht.is_alive():
        logger.warning("DHT process %s outlived its shutdown; killing it", dht.pid)
        dht.kill()
        dht.join(_UNLINK_GRACE)
    _, alive = psutil.wait_procs(helpers, timeout=_UNLINK_GRACE)
    for helper in alive:
        logger.warning("the DHT's helper %s outlived it; killing it", helper.pid)
        with contextlib.suppress(psutil.Error):  # gone already, or its pid reused: psutil then refuses
            helper.kill()
    psutil.wait_procs(alive, timeout=_UNLINK_GRACE)


def hung_dht_state(dht: DHT) -> str:
    """What a DHT process that is alive but not ready is doing, for the log: whether its p2p daemon is up (a hang in
    the daemon's start or in the first pings of bootstrap peers) and where its threads wait in the kernel (a futex is
    a lock or a future; epoll an event loop waiting for the network)."""
    try:
        helpers = psutil.Process(dht.pid).children(recursive=True)
        waits = Counter(_wait_channel(task) for task in Path(f"/proc/{dht.pid}/task").iterdir())
    except (psutil.Error, OSError):
        return "its process is gone"
    daemon = ", ".join(f"{p.pid} {p.name()}" for p in helpers) if helpers else "none"
    return f"its helpers: {daemon}; its threads wait in " + ", ".join(f"{w} x{n}" for w, n in waits.most_common())


def _wait_channel(task: Path) -> str:
    try:
        return (task / "wchan").read_text().strip() or "running"
    except OSError:
        return "unknown"


def stop_dht(dht: DHT) -> None:
    """Shut ``dht`` down, killing it and its helpers where they outlive hivemind's terminate; if its daemon or its
    client left a socket file behind, unlink it. Safe to call again on a DHT it stopped."""
    helpers = _helpers(dht)
    paths = {p for p in socket_paths(dht) if p} | _listened_sockets(dht, helpers)
    try:
        dht.shutdown()
    except OSError as e:  # asked to shut down before (its pipe is closed) but still alive: killed below
        logger.debug("DHT shutdown request failed: %s", e)
    _end(dht, helpers)
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
