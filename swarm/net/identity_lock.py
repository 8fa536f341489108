"""Which process on this machine uses which identity key: an exclusive `flock` on ``<key>.lock``, held for life.

Two processes with one key would be one peer id twice in the DHT (hivemind refuses the second with a traceback).
A process claims its key by locking ``<key>.lock`` and keeps the lock until it exits; the kernel frees the lock of
a process that died, however it died, so a stale lock file never blocks anyone. The lock file holds the holder's
pid, which the refusal names.

With the default key (no ``--identity``), peers started by hand on one machine take the first free slot among
``identity.key``, ``identity-2.key``, ``identity-3.key``... next to it, so each gets its own peer id.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

MAX_SLOTS = 64
"""Numbered default identities a machine offers (``identity.key`` .. ``identity-64.key``)."""


class IdentityTaken(ValueError):
    """The key is in use by another live process on this machine (or every default slot is)."""


class FileLock:
    """An exclusive, non-blocking `flock` on `path`, held until `release` (or the process's end).

    A forked child (hivemind's DHT process) closes its copy of the descriptor at once, so that it never keeps the
    lock after this process died: the lock lives exactly as long as the process that took it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock and write this process's pid into the file; False if another open file holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        _held.add(self)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the lock
            self._fd = None
        _held.discard(self)


_held: set[FileLock] = set()
"""Every lock this process holds (also kept from the garbage collector: a lock is held until released)."""


def _forget_in_child() -> None:
    """In a forked child: close the copies of the parent's lock descriptors (the parent's locks stay held)."""
    for lock in list(_held):
        if lock._fd is not None:
            try:
                os.close(lock._fd)
            except OSError:
                pass
            lock._fd = None
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def is_locked(path: str | Path) -> bool:
    """Whether another open file holds the lock on `path` (False if there is no such file)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock this probe may have taken


def holder_pid(path: str | Path) -> int | None:
    """The pid written into lock file `path` by its holder, or None if unreadable."""
    try:
        text = Path(path).read_text(errors="replace")[:32].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lock_path(key: str | Path) -> Path:
    return Path(f"{key}.lock")


def numbered_key(key: str | Path, slot: int) -> Path:
    """Slot 1 is `key` itself, slot n > 1 is ``<stem>-n<suffix>`` beside it (identity.key -> identity-2.key)."""
    key = Path(key)
    return key if slot == 1 else key.with_name(f"{key.stem}-{slot}{key.suffix}")


def claim_identity(key: str | Path, *, numbered: bool = False) -> tuple[Path, FileLock]:
    """Claim `key` for this process; with `numbered`, the first free slot of `numbered_key(key, n)` instead.

    :returns: the key file claimed and its lock (keep it: releasing it frees the key for another process)
    :raises IdentityTaken: the key (every slot, with `numbered`) is held by another live process, with a message
      that says what to do
    """
    for slot in range(1, MAX_SLOTS + 1 if numbered else 2):
        path = numbered_key(key, slot)
        lock = FileLock(lock_path(path))
        if lock.acquire():
            return path, lock
    if numbered:
        raise IdentityTaken(f"all {MAX_SLOTS} default identities next to {key} are in use by processes on this "
                            "machine: pass --identity FILE")
    pid = holder_pid(lock_path(key))
    holder = f"process {pid}" if pid is not None else "another process"
    raise IdentityTaken(f"identity {key} is in use by {holder} on this machine (one key is one peer): pass a "
                        "different --identity FILE")
