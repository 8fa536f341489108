"""`SidecarStarter`: gossip sidecars forked from one process that has already imported py-libp2p.

A cold sidecar spends ~1.3 s of CPU importing py-libp2p before it does anything, the largest share of a local swarm's
start (`benchmarks/swarm_cpu.py --start`), and N owners on one host pay it N times. The starter imports it once and
forks a sidecar for each owner that asks; the forks share its pages until they write them.

For owners on the starter's host, in its network namespace, run by its user: `LocalSwarm` starts one and names it
to its coordinator and peers in `SIDECAR_STARTER_ENV`; `GossipClient.start` asks it, and starts its sidecar cold
where none is named or the starter cannot be reached.

Protocol, on an abstract unix socket (one per network namespace, no file to remove; JSON lines, no pickle):

- owner -> starter: `{"args": [...]}`: the sidecar's flags, without `--fd` and `--owner-pid`, with two descriptors
  attached (SCM_RIGHTS): the sidecar's end of the owner's socketpair, and where its log goes;
- starter -> owner: `{"started": pid}` or `{"error": why}`, then `{"exited": pid, "code": c}` when the sidecar ends
  (`c` as `Popen.returncode`). The connection stays open for the sidecar's life.

The owner is the process that connected (SO_PEERCRED), never what a request says; another user's process is
refused. The launcher reads `{"ready": true}` and `{"forked": pid, "owner": pid}` on the starter's stdout (to freeze
or kill a peer together with its sidecar) and ends the starter by closing its stdin; the sidecars left are killed.
A sidecar outlives a starter that crashed: it watches its owner, not its parent.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

SIDECAR_STARTER_ENV = "SKIPPIPE_SIDECAR_STARTER"
"""The abstract socket name of the starter an owner asks for its sidecar (unset: sidecars start cold)."""
MAX_REQUEST_BYTES = 64 * 1024
REQUEST_TIMEOUT = 5.0
"""A connection that has not sent its whole request by then is dropped."""
ANSWER_TIMEOUT = 30.0
READY_TIMEOUT = 60.0
REFUSED_FLAGS = ("--fd", "--owner-pid")
UNKNOWN_EXIT = 255
"""The exit code reported for a forked sidecar whose starter died before saying how it ended."""

_SERVE_SCRIPT = "import sys; from swarm.control.sidecar_starter import serve; sys.exit(serve())"
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class SidecarStarterError(RuntimeError):
    """The starter could not be reached or refused to fork: start the sidecar cold."""


# ---- the owner's side --------------------------------------------------------------------------------------------
class ForkedSidecar:
    """A sidecar the starter forked for this owner, with what `GossipClient` uses of `subprocess.Popen`: pid,
    returncode, poll, wait, send_signal, terminate, kill. This process is not its parent: signals go through a pidfd
    (never to a reused pid), and its exit code comes from the starter."""

    def __init__(self, pid: int, conn: socket.socket, answers: bytes = b"") -> None:
        self.pid, self._conn, self._buffer = pid, conn, answers
        self.args = ["gossip-sidecar"]
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # ended and reaped already: the starter's answer says how
            self._pidfd = None
        self._starter_gone = False
        self._lock = threading.Lock()  # one waiter at a time
        self._fds_lock = threading.Lock()  # a signal never goes through a closed (maybe reused) descriptor

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.wait(0.0)
        return None

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._lock:
            while self.returncode is None:
                left = 0.5 if end is None else max(0.0, min(0.5, end - time.monotonic()))
                watched = [] if self._starter_gone else [self._conn]
                watched += [] if self._pidfd is None else [self._pidfd]
                readable, _, _ = select.select(watched, [], [], left)
                if self._conn in readable:
                    self._read_answers()
                elif self._pidfd in readable and self._starter_silent(2.0):
                    self._finish(UNKNOWN_EXIT)  # ended, and no starter says how
                if self.returncode is None and end is not None and time.monotonic() >= end:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            return self.returncode

    def _starter_silent(self, seconds: float) -> bool:
        """Whether the starter is gone or has nothing to say for `seconds` (it reports an exit within ~0.1 s)."""
        return self._starter_gone or not select.select([self._conn], [], [], seconds)[0]

    def send_signal(self, sig: int) -> None:
        with self._fds_lock:
            if self.returncode is None and self._pidfd is not None:
                with contextlib.suppress(ProcessLookupError, OSError):
                    signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_answers(self) -> None:
        try:
            chunk = self._conn.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:  # the starter is gone: the pidfd alone tells when the sidecar ends
            self._starter_gone = True
            if self._pidfd is None:
                self._finish(UNKNOWN_EXIT)
            return
        self._buffer += chunk
        self._take_answers()

    def _take_answers(self) -> None:
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                answer = json.loads(line)
                if int(answer["exited"]) == self.pid:
                    self._finish(int(answer["code"]))

    def _finish(self, code: int) -> None:
        with self._fds_lock:
            self.returncode = code
            with contextlib.suppress(OSError):
                self._conn.close()
            if self._pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._pidfd)


def fork_sidecar(name: str, args: list[str], owner_end: socket.socket, log_fd: int) -> ForkedSidecar:
    """Ask the starter at abstract socket `name` for a sidecar run with `args`, talking to this process over
    `owner_end` and logging to `log_fd` (both sent, not consumed: close them once this returns).

    :raises SidecarStarterError: no starter answers there, or it refused or failed to fork
    """
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(ANSWER_TIMEOUT)
        conn.connect("\0" + name)
        request = json.dumps({"args": [str(a) for a in args]}).encode() + b"\n"
        socket.send_fds(conn, [request], [owner_end.fileno(), log_fd])
        line = b""
        while b"\n" not in line:
            chunk = conn.recv(4096)
            if not chunk:
                raise SidecarStarterError("the sidecar starter closed the connection without an answer")
            line += chunk
        first, rest = line.split(b"\n", 1)
        answer = json.loads(first)
        if not isinstance(answer, dict) or not isinstance(answer.get("started"), int):
            raise SidecarStarterError(f"the sidecar starter did not fork: {answer}")
        conn.settimeout(None)
        return ForkedSidecar(answer["started"], conn, rest)
    except (OSError, ValueError) as e:
        conn.close()
        raise SidecarStarterError(f"sidecar starter {name!r}: {e}") from None
    except BaseException:
        conn.close()
        raise


# ---- the launcher's side -----------------------------------------------------------------------------------------
class SidecarStarter:
    """Starts the starter, tells owners where it is (`name`), and knows which sidecar is whose (`of`).

    :param env: the starter's environment
    :param log: where its own output goes (an import that fails says why there)
    """

    def __init__(self, env: dict[str, str] | None = None, log: Path | None = None) -> None:
        self.name = f"skippipe-sidecars-{os.getpid()}-{os.urandom(6).hex()}"
        """The abstract socket name owners are given in `SIDECAR_STARTER_ENV`."""
        self.log = log
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (closed below)
        env = dict(env or os.environ)  # importable from any working directory, as a cold sidecar is
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVE_SCRIPT, self.name], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=out, env=env)
        finally:
            if log is not None:
                out.close()
        self._owners: dict[int, set[int]] = {}
        self._changed = threading.Condition()
        self._ready = False
        threading.Thread(target=self._read, name="sidecar-starter-reader", daemon=True).start()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> bool:
        """Until the starter listens (True), has exited or `timeout` passed (False)."""
        end = time.monotonic() + timeout
        with self._changed:
            while not self._ready and self.proc.poll() is None and time.monotonic() < end:
                self._changed.wait(0.2)
            return self._ready

    def of(self, owner: int) -> set[int]:
        """The pids of the live sidecars the starter forked for process `owner`."""
        with self._changed:
            return set(self._owners.get(owner, ()))

    def stop(self, timeout: float = 10.0) -> None:
        """End the starter: it kills the sidecars still running (their owners close them first) and exits."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                msg = json.loads(raw)
                with self._changed:
                    if msg.get("ready") is True:
                        self._ready = True
                    elif "forked" in msg:
                        self._owners.setdefault(int(msg["owner"]), set()).add(int(msg["forked"]))
                    elif "exited" in msg:
                        for pids in self._owners.values():
                            pids.discard(int(msg["exited"]))
                    self._changed.notify_all()
        with self._changed:
            self._ready = False
            self._changed.notify_all()


# ---- the starter's side ------------------------------------------------------------------------------------------
def serve() -> int | None:
    """The starter's loop (its abstract socket name is `sys.argv[1]`); None when its input ends, in the starter, or
    a sidecar's exit code, in a fork, which has run the sidecar: the caller exits with it."""
    from swarm.control import gossip_sidecar

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl+C is for the owners, which close their pipes
    gc.collect()
    gc.freeze()  # what the imports allocated stays shared with the forks (a collection would write every page)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + sys.argv[1])
    listener.listen(64)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # nothing else of the starter's writes into the announcements
    os.close(null)
    server = _Server(listener, out)
    forked = server.run()
    if forked is None:
        return None
    args, owner, owner_end = forked
    try:
        owner_pidfd = os.pidfd_open(owner)
    except OSError:  # it died while this was forked: nothing to serve
        return 2
    return gossip_sidecar.main([*args, "--fd", str(owner_end), "--owner-pid", str(owner)], owner_pidfd=owner_pidfd)


class _Server:
    """The starter's select loop: takes requests, forks, reaps, reports. Single-threaded, so that forks are safe."""

    def __init__(self, listener: socket.socket, out) -> None:
        self.listener, self.out = listener, out
        self.pending: dict[socket.socket, tuple[float, bytes, list[int]]] = {}
        self.children: dict[int, socket.socket] = {}

    def run(self) -> tuple[list[str], int, int] | None:
        """Serve until stdin ends (None, the sidecars left killed); in a fork: its (args, owner, owner's end)."""
        self._say({"ready": True})
        try:
            while True:
                watched = [0, self.listener, *self.pending]
                readable, _, _ = select.select(watched, [], [], 0.1)
                self._reap()
                self._drop_stale()
                if 0 in readable and not os.read(0, 4096):
                    return None
                if self.listener in readable:
                    self._accept()
                for conn in [c for c in readable if c in self.pending]:
                    forked = self._receive(conn)
                    if forked is not None:
                        return forked
        finally:
            if self.out is not None:  # the starter, not a fork
                self._kill_all()

    def _say(self, msg: dict) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.out.write(json.dumps(msg) + "\n")

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            _answer(conn, {"error": "not this starter's user"})
            conn.close()
            return
        conn.setblocking(False)
        self.pending[conn] = (time.monotonic(), b"", [])

    def _drop_stale(self) -> None:
        for conn, (since, _, fds) in list(self.pending.items()):
            if time.monotonic() - since > REQUEST_TIMEOUT:
                self._refuse(conn, fds, "no whole request in time")

    def _receive(self, conn: socket.socket) -> tuple[list[str], int, int] | None:
        since, data, fds = self.pending[conn]
        try:
            chunk, new_fds, _, _ = socket.recv_fds(conn, 4096, 2)
        except OSError:
            chunk, new_fds = b"", []
        fds = fds + list(new_fds)
        if not chunk:
            self._refuse(conn, fds, None)
            return None
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            self._refuse(conn, fds, f"request over {MAX_REQUEST_BYTES} bytes")
            return None
        if b"\n" not in data:
            self.pending[conn] = (since, data, fds)
            return None
        del self.pending[conn]
        try:
            args = _request_args(data.split(b"\n", 1)[0])
            if len(fds) != 2:
                raise ValueError(f"want 2 descriptors (the owner's socket, the log), got {len(fds)}")
        except ValueError as e:
            self._refuse(conn, fds, f"bad request: {e}")
            return None
        owner, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return self._fork(conn, args, owner, fds)

    def _fork(self, conn: socket.socket, args: list[str], owner: int, fds: list[int]) -> tuple | None:
        try:
            pid = os.fork()
        except OSError as e:
            self._refuse(conn, fds, f"fork failed: {e}")
            return None
        if pid == 0:
            return self._become_sidecar(conn, args, owner, fds)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        _answer(conn, {"started": pid})
        self._say({"forked": pid, "owner": owner})
        return None

    def _become_sidecar(self, conn: socket.socket, args: list[str], owner: int, fds: list[int]
                        ) -> tuple[list[str], int, int]:
        """In the fork: drop the starter's sockets and pipes, log to the owner's file; what the sidecar runs with."""
        owner_end, log = fds
        for other in [self.listener, conn, *self.pending, *self.children.values()]:
            other.close()
        for _, _, others in self.pending.values():  # other owners' pipes: a copy here would outlive their sidecars
            for fd in others:
                os.close(fd)
        self.out.close()
        self.out, self.pending, self.children = None, {}, {}
        null = os.open(os.devnull, os.O_RDWR)
        for target, source in ((0, null), (1, null), (2, log)):
            os.dup2(source, target)
        os.close(null)
        os.close(log)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return args, owner, owner_end

    def _refuse(self, conn: socket.socket, fds: list[int], why: str | None) -> None:
        self.pending.pop(conn, None)
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if why is not None:
            print(f"sidecar starter: refused a request: {why}", file=sys.stderr, flush=True)
            _answer(conn, {"error": why})
        conn.close()

    def _reap(self) -> None:
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 255 << 8
            if done:
                self._report(pid, os.waitstatus_to_exitcode(status))

    def _report(self, pid: int, code: int) -> None:
        conn = self.children.pop(pid)
        _answer(conn, {"exited": pid, "code": code})
        conn.close()
        self._say({"exited": pid, "code": code})

    def _kill_all(self) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self._report(pid, -signal.SIGKILL)


def _request_args(line: bytes) -> list[str]:
    """The sidecar flags of one request line; the ones only the starter may set are refused."""
    request = json.loads(line)
    args = request.get("args") if isinstance(request, dict) else None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args) or len(args) > 64:
        raise ValueError("want {\"args\": [up to 64 strings]}")
    if any(len(flag) > 2 and any(r.startswith(flag) for r in REFUSED_FLAGS)  # argparse takes abbreviations
           for flag in (a.split("=", 1)[0] for a in args if a.startswith("--"))):
        raise ValueError(f"{' and '.join(REFUSED_FLAGS)} are the starter's to set")
    return args


def _answer(conn: socket.socket, msg: dict) -> None:
    with contextlib.suppress(OSError):
        conn.setblocking(True)
        conn.settimeout(1.0)
        conn.sendall(json.dumps(msg).encode() + b"\n")
