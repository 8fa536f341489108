"""Reaper: the helpers a node starts (its DHT process, p2pd, the gossip sidecar) die with it, even on SIGKILL.

hivemind forks its DHT process from the node and that process starts p2pd; neither notices when the node dies, so a
``kill -9`` of the node leaves both running, orphaned, with p2pd's unix socket. A process cannot clean up after its
own SIGKILL, so :meth:`Reaper.start` spawns a small watchdog (``python -m swarm.net.reaper --parent PID``, stdlib and
psutil only, in a session of its own so that a Ctrl+C or SIGTERM to the terminal's process group does not reach it).

Contract:
- The watchdog notes the node's descendants (pid and create time) every ``SCAN_INTERVAL`` seconds, and at once when
  asked: :meth:`Reaper.watch` after starting a helper returns once the helper is on the list. One noted stays on the
  list while it lives (a scan cut short by the node's death must not empty it), as do the node's own sockets.
- When the node dies (however: its pipe closes or, should a forked child hold the pipe, its pidfd fires) or calls
  :meth:`Reaper.stop`, the watchdog takes the last list, keeps the processes still alive with the same create time
  (a reused pid is never touched) plus their own descendants, sends them SIGTERM, then SIGKILL after ``TERM_GRACE``
  seconds, and unlinks the unix socket files they had open that no process listens on any more. It never signals
  its parent, nor anything that was not the parent's descendant when it looked.
- Helpers that clean up after their clients and then exit by themselves (``SELF_EXITING``: the multiprocessing
  resource tracker, torch's shared-memory manager) get that chance first, and are left alone on a clean stop.
- The node's multiprocessing temporary directory (where its resource sharer listens, created whenever a descriptor is
  first passed, maybe after the last scan) is made before the watchdog starts and named to it: after the node's death
  the watchdog removes the dead sockets in it, and the directory once empty.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing.util
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

SCAN_INTERVAL = 2.0
"""Seconds between two scans of the node's descendants when nobody asks for one."""
TERM_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL (and how long self-exiting helpers get to leave on their own)."""
ACK_TIMEOUT = 5.0
"""How long start() and watch() wait for the watchdog to confirm its scan."""
STOP_TIMEOUT = 10.0
"""How long stop() waits for the watchdog to finish its sweep (two grace periods and the socket checks)."""
PARENT_POLL = 0.5
"""Seconds between two checks that the parent is alive, where pidfd_open is not available."""
_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory holding the `swarm` package, so that the watchdog finds it whatever the node's working directory."""
SELF_EXITING = ("multiprocessing.resource_tracker", "torch_shm_manager")
"""Command-line fragments of helpers that exit by themselves (after cleaning up) once their clients are gone."""


# ---- unix sockets (also used by dht_shutdown and the local launcher) -------------------------------------------
def unix_socket_paths(pid: int) -> set[str]:
    """Paths of the unix sockets process `pid` has open, read from its own /proc view: a process in another network
    namespace (an emulated host) lists its sockets only there, not in this process's /proc/net/unix."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
        lines = Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
    except OSError:  # gone already, or not ours to read
        return set()
    # columns: Num RefCount Protocol Flags Type St Inode [Path]
    return {parts[7] for parts in map(str.split, lines) if len(parts) >= 8 and parts[6] in inodes}


def is_listened_on(path: str) -> bool:
    """Whether a process accepts connections on the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True  # busy or not ours to judge: leave it alone
        return True


MP_TEMP_DIR_PREFIX = "pymp-"
"""multiprocessing's per-process temporary directory (``util.get_temp_dir``), where its resource sharer listens
(hivemind's futures pass descriptors through it): the process removes it at exit, unless it was killed."""


def unlink_if_dead(path: str) -> None:
    """Remove a socket file nobody listens on any more (abstract sockets and other files are left alone), and the
    multiprocessing temporary directory it was in once that is empty."""
    try:
        if not path.startswith("/") or not stat.S_ISSOCK(os.lstat(path).st_mode) or is_listened_on(path):
            return
        os.unlink(path)
        logger.info("removed the socket %s left behind", path)
    except OSError:
        return  # gone already (its owner removed it), or not ours
    directory = os.path.dirname(path)
    if os.path.basename(directory).startswith(MP_TEMP_DIR_PREFIX):
        with contextlib.suppress(OSError):  # not empty: something else of its process is still there
            os.rmdir(directory)


def unlink_when_dead(paths: Iterable[str], within: float) -> None:
    """`unlink_if_dead` each of `paths`, looking again for up to `within` seconds at those still listened on (a
    daemon that failed may still be exiting); one listened on after that belongs to a live process and stays."""
    end, paths = time.monotonic() + within, set(paths)  # the caller's collection is left as it was
    while True:
        for path in list(paths):
            unlink_if_dead(path)
            if not os.path.lexists(path):
                paths.discard(path)
        if not paths or time.monotonic() >= end:
            return
        time.sleep(0.1)


# ---- the node's side ---------------------------------------------------------------------------------------------
class Reaper:
    """The node's handle on its watchdog. Create one with :meth:`start` (not the constructor), in the node's process:

        reaper = Reaper.start()
        dht = hivemind.DHT(..., start=True)
        reaper.watch()  # the DHT process and its p2pd are covered from now on
        ...
        stop_dht(dht)
        reaper.stop()

    Thread-safe. In a process forked from the node (which inherits this object), :meth:`watch` and :meth:`stop` do
    nothing: only the node speaks for itself.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._seq = 0
        self._received = b""
        self._stopped = False

    @classmethod
    def start(cls, timeout: float = ACK_TIMEOUT, scan_interval: float = SCAN_INTERVAL) -> Reaper:
        """Spawn the watchdog for this process and return once it has listed this process's descendants (or after
        ``timeout`` seconds, with a warning); it scans again every ``scan_interval`` seconds and when asked."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
        temp_dir = multiprocessing.util.get_temp_dir()  # made now (removed at exit), so the watchdog knows it
        proc = subprocess.Popen([sys.executable, "-m", "swarm.net.reaper", "--parent", str(os.getpid()),
                                 "--mp-temp-dir", temp_dir, "--scan-interval", str(scan_interval)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, bufsize=0, env=env,
                                start_new_session=True)
        reaper = cls(proc)
        if not reaper._await(b"ready", timeout):
            logger.warning("reaper watchdog (pid %d) did not report ready within %.0f s", proc.pid, timeout)
        logger.debug("reaper watchdog started (pid %d)", proc.pid)
        return reaper

    _shared: Reaper | None = None
    _users = 0
    _shared_lock = threading.Lock()

    @classmethod
    def acquire(cls) -> Reaper:
        """The process's one reaper (started on first use): every node of a process shares it, since a reaper
        sweeps all of its process's descendants when it stops. Give it back with :meth:`release`."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared._owner != os.getpid():
                cls._shared, cls._users = cls.start(), 0
            cls._users += 1
            return cls._shared

    def release(self) -> None:
        """A node of this process no longer needs the reaper; the last one's release stops it."""
        with Reaper._shared_lock:
            if Reaper._shared is not self:
                self.stop()
                return
            Reaper._users -= 1
            if Reaper._users > 0:
                return
            Reaper._shared = None
        self.stop()

    @property
    def pid(self) -> int:
        """The watchdog's pid."""
        return self._proc.pid

    def watch(self, timeout: float = ACK_TIMEOUT) -> bool:
        """Have the watchdog list this process's descendants now (call it right after starting a helper).

        Returns whether the watchdog confirmed the scan within ``timeout`` seconds; never raises.
        """
        with self._lock:
            if self._stopped or os.getpid() != self._owner:
                return False
            self._seq += 1
            token = f"scanned {self._seq}".encode()
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(f"scan {self._seq}\n".encode())
            except (OSError, ValueError) as e:  # the watchdog is gone (or its pipe closed)
                logger.debug("reaper watchdog (pid %d) unreachable: %s: %s", self.pid, type(e).__name__, e)
                return False
            if not self._await(token, timeout):
                logger.debug("reaper watchdog (pid %d) did not confirm scan %d", self.pid, self._seq)
                return False
            return True

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the watchdog; it first stops whatever descendants of this process are left (normally none: stop the
        helpers first) and never this process itself. Waits up to ``timeout`` seconds for it to exit. Idempotent."""
        with self._lock:
            if self._stopped or os.getpid() != self._owner:
                return
            self._stopped = True
            with contextlib.suppress(OSError, ValueError):
                assert self._proc.stdin is not None
                self._proc.stdin.write(b"stop\n")
            for pipe in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("reaper watchdog (pid %d) still sweeping after %.0f s", self.pid, timeout)

    def __enter__(self) -> Reaper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _await(self, token: bytes, timeout: float) -> bool:
        """Read the watchdog's replies until the line ``token``; False on timeout or if the watchdog is gone."""
        stdout = self._proc.stdout
        if stdout is None:
            return False
        deadline = time.monotonic() + timeout
        while True:
            *lines, self._received = self._received.split(b"\n")
            if token in lines:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                if not select.select([stdout], [], [], left)[0]:
                    return False
                data = os.read(stdout.fileno(), 4096)
            except (OSError, ValueError):
                return False
            if not data:
                return False
            self._received += data


# ---- the watchdog's side -----------------------------------------------------------------------------------------
def _alive(proc: psutil.Process) -> bool:
    """Running, the same process (create time) and not a zombie (a zombie holds nothing any more)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(" ".join(proc.cmdline()).split())  # on one line, even for `python -c` with a script
    except psutil.Error:
        return ""


def _wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` seconds for ``procs`` to exit (not our children: polled); the survivors."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _terminate(procs: list[psutil.Process], grace: float) -> list[psutil.Process]:
    """SIGTERM, wait ``grace`` seconds, SIGKILL the survivors; returns those that could not be stopped."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        for p in procs:
            with contextlib.suppress(psutil.Error):  # gone, or its pid reused: psutil then refuses to signal
                p.send_signal(sig)
        procs = _wait_gone(procs, wait)
        if not procs:
            break
    return procs


class _Watchdog:
    def __init__(self, parent: int, scan_interval: float, grace: float, mp_temp_dir: str | None = None) -> None:
        self.parent_pid = parent
        self.mp_temp_dir = mp_temp_dir
        """The parent's multiprocessing temporary directory: its sockets may postdate the last scan."""
        self.parent = psutil.Process(parent)
        self.me = os.getpid()
        self.scan_interval = scan_interval
        self.grace = grace
        self.snapshot: dict[int, psutil.Process] = {}  # pid -> process as scanned (psutil keeps its create time)
        self.parent_sockets: set[str] = set()
        """Unix sockets the parent itself had open at the last scan (a p2p client's, say): a parent killed with
        SIGKILL leaves their files behind."""

    def parent_alive(self) -> bool:
        return os.getppid() == self.parent_pid

    def scan(self) -> None:
        """Add what the parent has now to what it had: a process or socket once seen stays on the lists while it
        lives. A scan the parent's death cuts short (its children re-parented half-way, its /proc emptied) then
        adds less, but takes nothing away from the last whole one."""
        if not self.parent_alive():
            return  # its children were re-parented: the last snapshot stands
        try:
            children = self.parent.children(recursive=True)
        except psutil.Error:
            children = []
        sockets = unix_socket_paths(self.parent_pid)
        self.snapshot = {pid: p for pid, p in self.snapshot.items() if _alive(p)}
        self.snapshot.update((p.pid, p) for p in children if p.pid != self.me and p.pid not in self.snapshot)
        self.parent_sockets = {path for path in self.parent_sockets if os.path.lexists(path)} | sockets

    def reply(self, line: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(sys.stdout.fileno(), line + b"\n")

    def run(self) -> int:
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(self.parent_pid)  # readable once the parent exits (Linux >= 5.3)
        if not self.parent_alive():
            logger.error("parent %d is gone already: exiting", self.parent_pid)
            return 2
        self.scan()
        self.reply(b"ready")
        stdin, received, last_scan = sys.stdin.fileno(), b"", time.monotonic()
        reason = ""
        while not reason:
            if not self.parent_alive():
                reason = "died"
                break
            wait = max(0.0, last_scan + self.scan_interval - time.monotonic())
            fds = [stdin] if pidfd is None else [stdin, pidfd]
            readable = select.select(fds, [], [], wait if pidfd is not None else min(wait, PARENT_POLL))[0]
            if pidfd is not None and pidfd in readable:
                reason = "died"
            elif stdin in readable:
                data = os.read(stdin, 4096)
                if not data:
                    reason = "closed the pipe"
                    break
                *lines, received = (received + data).split(b"\n")
                if b"stop" in lines:
                    reason = "asked to stop"
                    break
                requests = [line[len(b"scan "):].strip() for line in lines if line.startswith(b"scan ")]
                if requests:
                    self.scan()
                    last_scan = time.monotonic()
                    for seq in requests:
                        self.reply(b"scanned " + seq)
            elif time.monotonic() >= last_scan + self.scan_interval:
                self.scan()
                last_scan = time.monotonic()
        self.sweep(f"parent {self.parent_pid} {reason}", clean=reason == "asked to stop")
        return 0

    def sweep(self, why: str, clean: bool) -> None:
        """Stop what is left of the last snapshot. ``clean``: the parent asked, and lives on (otherwise it died or
        closed the pipe on its way out: a pipe closes a moment before its owner is gone, so do not ask whether it is
        alive)."""
        victims = {pid: p for pid, p in self.snapshot.items() if _alive(p)}
        for p in list(victims.values()):
            with contextlib.suppress(psutil.Error):
                for child in p.children(recursive=True):
                    victims.setdefault(child.pid, child)
        victims = {pid: p for pid, p in victims.items() if pid not in (self.me, self.parent_pid) and _alive(p)}
        if not victims:
            logger.debug("%s: no helpers left", why)
            if not clean:
                self.remove_parent_leftovers(set())
            return
        names = {pid: _cmdline(p) for pid, p in victims.items()}
        self_exiting = [p for pid, p in victims.items() if any(h in names[pid] for h in SELF_EXITING)]
        others = [p for p in victims.values() if p not in self_exiting]
        if clean:  # those leave with their client, the parent
            victims = {p.pid: p for p in others}
            self_exiting = []
        sockets = set().union(*(unix_socket_paths(pid) for pid in victims))
        if others:
            log = logger.info if clean else logger.warning
            log("%s: stopping %s", why, ", ".join(f"{p.pid} ({names[p.pid][:60]})" for p in others))
        stuck = _terminate(others, self.grace)
        if self_exiting:
            stuck += _terminate(_wait_gone(self_exiting, self.grace), self.grace)
        if stuck:
            logger.error("could not stop %s", [p.pid for p in stuck])
        if clean:
            for path in sorted(sockets):
                unlink_if_dead(path)
        else:
            self.remove_parent_leftovers(sockets)

    def remove_parent_leftovers(self, sockets: set[str]) -> None:
        """After the parent's death: unlink ``sockets``, the parent's own sockets of the last scan and those in its
        multiprocessing temporary directory when nobody listens on them, then that directory if it is empty."""
        sockets = sockets | self.parent_sockets
        if self.mp_temp_dir is not None:
            with contextlib.suppress(OSError):
                sockets |= {str(p) for p in Path(self.mp_temp_dir).iterdir()}
        for path in sorted(sockets):
            unlink_if_dead(path)
        if self.mp_temp_dir is not None:
            with contextlib.suppress(OSError):  # gone already, or something else is still in it
                os.rmdir(self.mp_temp_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stop the descendants of --parent when it dies or asks to.")
    parser.add_argument("--parent", type=int, required=True, help="the node: must be this process's parent")
    parser.add_argument("--scan-interval", type=float, default=SCAN_INTERVAL, help="seconds")
    parser.add_argument("--grace", type=float, default=TERM_GRACE, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--mp-temp-dir", help="the parent's multiprocessing temporary directory, cleared on its death")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s reaper[%(process)d] %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stray Ctrl+C must not end it before it cleans up
    forbidden = sorted({"hivemind", "torch"} & set(sys.modules))
    if forbidden:  # the watchdog stays small: the package map must not import heavy code
        logger.error("reaper watchdog must not import %s: keep swarm/__init__.py free of such imports", forbidden)
        return 2
    if os.getppid() != args.parent:
        logger.error("parent %d is not this process's parent: exiting", args.parent)
        return 2
    if args.mp_temp_dir is not None and not os.path.basename(args.mp_temp_dir).startswith(MP_TEMP_DIR_PREFIX):
        logger.error("--mp-temp-dir %r is not a multiprocessing temporary directory: exiting", args.mp_temp_dir)
        return 2
    try:
        watchdog = _Watchdog(args.parent, args.scan_interval, args.grace, args.mp_temp_dir)
    except psutil.Error as e:
        logger.error("cannot watch parent %d: %s", args.parent, e)
        return 2
    return watchdog.run()


if __name__ == "__main__":
    sys.exit(main())
