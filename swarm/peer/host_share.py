"""How many torch threads a peer runs: its share of this machine's cores among the skippipe peers running on it.

Peers started by hand on one machine would each run torch with one thread per core and fight over the cores
(six peers on two cores trained ~10x slower than with one thread each). Each peer process registers in a
host-wide directory (one flocked file per live process, `HostRegistry`) and sizes its threads to
``cores // live peers``, again before every iteration, so the first peers shrink as more start. ``--threads N``
fixes the number instead.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from swarm.net.identity_lock import FileLock, is_locked

logger = logging.getLogger(__name__)

HOST_REGISTRY = Path.home() / ".skippipe" / "running"
"""Where this user's live skippipe peers register (one ``<pid>-<random>.lock`` each)."""


def threads_for(cpus: int, peers: int) -> int:
    """Torch threads of one of `peers` peers sharing `cpus` cores: an equal share, at least one."""
    return max(1, cpus // max(1, peers))


def available_cpus() -> int:
    """Cores this process may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def live_peers(directory: str | Path) -> int:
    """Peers registered in `directory` whose process still lives (their file is locked); stale files of processes
    that died are removed on the way. A file is locked before it gets its ``.lock`` name, so an unlocked one is
    stale."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    live = 0
    for name in names:
        if not name.endswith(".lock"):
            continue
        path = Path(directory) / name
        if is_locked(path):
            live += 1
        else:
            path.unlink(missing_ok=True)
    return live


class HostRegistry:
    """This process's entry among the live peers of `directory`, held until `leave` or the process's end."""

    def __init__(self, directory: str | Path = HOST_REGISTRY) -> None:
        self.directory = Path(directory)
        self._lock: FileLock | None = None

    def join(self) -> None:
        """Register this process (held until `leave` or its end); the entries of processes that died unregistered
        (killed) are swept first, so that they do not pile up where nobody counts (peers run with --threads)."""
        live_peers(self.directory)
        stem = self.directory / f"{os.getpid()}-{secrets.token_hex(4)}"
        lock = FileLock(stem.with_suffix(".tmp"))
        if not lock.acquire():  # a fresh random name: nobody else holds it
            raise RuntimeError(f"could not lock {lock.path}")
        os.rename(lock.path, stem.with_suffix(".lock"))  # counted only once locked
        lock.path = stem.with_suffix(".lock")
        self._lock = lock

    def leave(self) -> None:
        if self._lock is not None:
            self._lock.path.unlink(missing_ok=True)
            self._lock.release()
            self._lock = None


class ThreadShare:
    """Sizes torch's intra-op threads: `threads` if given, else `threads_for(available_cpus(), live peers)`.

    :param registry: the host registry directory to count live peers in (None: this peer is alone)
    """

    def __init__(self, threads: int | None = None, registry: str | Path | None = None) -> None:
        self.threads, self.registry = threads, registry

    def size(self) -> int:
        if self.threads is not None:
            return self.threads
        peers = live_peers(self.registry) if self.registry is not None else 1
        return threads_for(available_cpus(), peers)

    def apply(self) -> int:
        """Set torch's thread count to `size()` if it differs (cheap: call it every iteration); returns it."""
        import torch

        n = self.size()
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
            logger.info("torch uses %d thread(s): %s", n, "as asked (--threads)" if self.threads is not None else
                        f"{available_cpus()} cores shared by the skippipe peers on this machine")
        return n
