"""Start helper processes for multi-process tests and stop exactly those, by pid (never by name).

Leak detection: :func:`descendants` lists this process's live children (recursively) and
:func:`unbound_hivemind_sockets` lists hivemind socket files that no live socket is bound to any more.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import multiprocessing as mp
import os
import socket
from collections.abc import Iterable

import psutil

HIVEMIND_SOCKETS = "/tmp/hivemind-*.sock"
"""Where hivemind's p2pd and its clients put their unix sockets (hard-coded in hivemind, not in TMPDIR)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (prefer port 0 where the API allows it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def become_subreaper() -> bool:
    """Make orphaned grandchildren (e.g. a p2pd whose parent died) re-parent to us, so leak checks can see them."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def spawn(target, *args, name: str | None = None) -> mp.Process:
    """Start ``target(*args)`` in a fresh interpreter (spawn: no inherited threads or event loops)."""
    proc = mp.get_context("spawn").Process(target=target, args=args, name=name, daemon=False)
    proc.start()
    return proc


PROCESS_WIDE_HELPERS = ("multiprocessing.resource_tracker", "torch_shm_manager")
"""Singletons started on first use that live as long as the test run itself: not leaks."""


def descendants(pid: int | None = None) -> set[int]:
    """Live (non-zombie) descendants of ``pid`` (default: this process), except process-wide helpers.

    Reaps our zombie children on the way.
    """
    try:
        children = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    alive = set()
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(child.pid, os.WNOHANG)
            elif not any(h in " ".join(child.cmdline()) for h in PROCESS_WIDE_HELPERS):
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def describe(pids: Iterable[int]) -> list[str]:
    """``pid:command line`` of each pid, for leak reports."""
    out = []
    for pid in sorted(pids):
        try:
            out.append(f"{pid}:{' '.join(psutil.Process(pid).cmdline())[:120]}")
        except psutil.NoSuchProcess:
            out.append(f"{pid}:(gone)")
    return out


def stop_tree(pid: int, *, timeout: float = 10.0) -> None:
    """Terminate ``pid`` and all its descendants (collected first, so orphans are not missed), then kill."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    stop_pids([p.pid for p in procs], timeout=timeout)


def stop_pids(pids: Iterable[int], *, timeout: float = 10.0) -> None:
    """SIGTERM the given pids, wait up to ``timeout``, SIGKILL the survivors, and reap our own children."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=timeout)


def join_or_stop(proc: mp.Process, *, timeout: float = 10.0) -> None:
    """Wait for a helper process to exit on its own; stop its whole tree if it does not."""
    proc.join(timeout)
    if proc.is_alive():
        stop_tree(proc.pid, timeout=timeout)
        proc.join(timeout)


def hivemind_sockets() -> set[str]:
    return set(glob.glob(HIVEMIND_SOCKETS))


def bound_unix_paths() -> set[str]:
    """Paths of the unix sockets some live process has bound, in every network namespace: /proc/PID/net/unix lists
    those of PID's namespace, so one process per namespace is read."""
    bound: set[str] = set()
    namespaces: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            namespace = os.readlink(f"/proc/{pid}/ns/net")
            if namespace in namespaces:
                continue
            with open(f"/proc/{pid}/net/unix") as f:
                lines = f.readlines()
        except OSError:  # gone, or not ours to read
            continue
        namespaces.add(namespace)
        bound.update(parts[7] for parts in map(str.split, lines) if len(parts) >= 8)
    return bound


def unbound_hivemind_sockets(paths: Iterable[str]) -> set[str]:
    """Those of ``paths`` that still exist but that no live process has bound (left behind by a dead daemon).

    A daemon inside an emulated host (a network namespace, possibly another test's) binds its socket there, so every
    namespace's table is read (`bound_unix_paths`); unlinking a live daemon's socket would cut it off its client.
    Nothing is connected to: a connection would reach the live daemon's client as a stray stream."""
    bound = bound_unix_paths()
    return {p for p in paths if os.path.exists(p) and p not in bound}
