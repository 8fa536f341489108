"""`WarmStarter`: peer processes forked from one that has already imported what a peer imports.

A peer spends ~4-5 s of CPU before it does anything of its own: importing torch, hivemind (and scipy through it) and
the peer's modules, then torch._dynamo at its first optimizer call. N peers started on one host pay it N times, and
on a small machine that is most of a local swarm's start, and of each joiner's. The starter is one child process that
imports them once, then forks a peer per request; each fork takes its own arguments, environment and output file
and runs `skippipe-peer` as a fresh interpreter would, through to the interpreter's own exit (atexit handlers,
non-daemon threads). Pages are shared until written.

Only for peers in the launcher's own network namespace: one in an emulated host is started through `ip netns exec`.
The BLAS thread pools are sized in the starter (one thread: it imports with OMP_NUM_THREADS=1); torch's own threads
are set per peer (`--threads`).

Protocol (the launcher's pipes to the starter; our own processes, JSON lines, no pickle):
- in: `{"argv": [...], "env": {...}, "out": path}` per peer to start; end of input: kill what is left, exit;
- out: `{"ready": true}` once imported; `{"started": pid}` per request, in order (`{"error": text}` if the fork
  failed); `{"exited": pid, "code": c}` when a child ends, `c` as `Popen.returncode` (-N for signal N).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def python_entry(entry: str) -> list[str]:
    """The command line that runs click group `entry` of `swarm.cli.main` (`main` or `peer_main`) cold."""
    return [sys.executable, "-c", f"import sys; from swarm.cli.main import {entry}; sys.exit({entry}())"]


_SERVE_SCRIPT = "import sys; from swarm.local.warm_start import serve; sys.exit(serve())"
_PRELOAD = (  # what `skippipe-peer join` imports, and torch._dynamo, which torch.optim imports at its first call
    "swarm.cli.run", "swarm.peer.peer", "swarm.coordinator.scheduler_role", "swarm.peer.console",
    "swarm.peer.host_share", "swarm.control.membership", "torch._dynamo")
READY_TIMEOUT = 120.0


class WarmProcess:
    """One forked peer, with what a launcher uses of `subprocess.Popen`: pid, returncode, poll, wait, signals.
    Its exit status comes from the starter, which is its parent and reaps it."""

    def __init__(self, pid: int, starter: WarmStarter) -> None:
        self.pid, self._starter = pid, starter
        self.returncode: int | None = None
        self.args = ["skippipe-peer"]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._starter.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._starter.exit_code(self.pid, timeout=_seconds(timeout))
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # like Popen: a reaped child's pid may belong to someone else by now
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _seconds(timeout: float | None) -> float:
    return float("inf") if timeout is None else max(0.0, timeout)


class WarmStarter:
    """The launcher's side: starts the starter, asks it for peers, tracks their exits.

    :param env: the starter's environment (the peers get their own with each request)
    """

    def __init__(self, env: dict[str, str] | None = None, log: Path | None = None) -> None:
        env = {**(env or os.environ), "OMP_NUM_THREADS": "1"}
        self.log = log
        """Where the starter's own output goes (an import that fails says why there)."""
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (closed below)
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVE_SCRIPT], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=out, env=env)
        finally:
            if log is not None:
                out.close()
        self._exits: dict[int, int] = {}
        self._started: list[dict] = []
        self._changed = threading.Condition()
        self._ready = False
        self._lock = threading.Lock()  # one request at a time: answers come in request order
        threading.Thread(target=self._read, name="warm-starter-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
                exited = (int(msg["exited"]), int(msg["code"])) if "exited" in msg else None
            except (ValueError, TypeError, KeyError):
                continue
            with self._changed:
                if exited is not None:
                    self._exits[exited[0]] = exited[1]
                elif "ready" in msg:
                    self._ready = True
                else:
                    self._started.append(msg)
                self._changed.notify_all()
        with self._changed:  # the starter is gone: so is every child it had not reported (killed with it)
            self._ready = False
            self._changed.notify_all()

    def _wait_for(self, what, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._changed:
            while not what():
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not what()):
                    return what()
                self._changed.wait(min(left, 0.5))
            return True

    def spawn(self, argv: list[str], env: dict[str, str], out: Path) -> WarmProcess:
        """Fork a peer running `skippipe-peer *argv` with environment `env`, stdout and stderr appended to `out`.

        :raises RuntimeError: the starter is not running, or could not fork
        """
        answer = self.request({"argv": list(argv), "env": dict(env), "out": str(out)})
        if "started" not in answer:
            raise RuntimeError(f"the warm starter could not start a peer: {answer.get('error')}")
        return WarmProcess(int(answer["started"]), self)

    def request(self, message: dict) -> dict:
        """Send one request line and return the starter's answer to it (`{"started": pid}` or `{"error": why}`).

        :raises RuntimeError: the starter is not running, or did not answer
        """
        with self._lock:
            if not self._wait_for(lambda: self._ready, READY_TIMEOUT):
                raise RuntimeError(f"the warm starter is not running (exit {self.proc.poll()}; see {self.log})")
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write((json.dumps(message) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                raise RuntimeError(f"the warm starter is not running: {e}") from None
            if not self._wait_for(lambda: bool(self._started), 30.0):
                raise RuntimeError("the warm starter did not answer")
            with self._changed:
                return self._started.pop(0)

    def exit_code(self, pid: int, timeout: float = 0.0) -> int | None:
        """The exit code of child `pid` once the starter reaped it (waiting up to `timeout` s), else None. If the
        starter died, its children die with it (SIGKILL, `_die_with`): -9 once `pid` is gone."""
        end = time.monotonic() + timeout
        self._wait_for(lambda: pid in self._exits or self.proc.poll() is not None, timeout)
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
        while self.proc.poll() is not None:
            if not _alive(pid):
                return -signal.SIGKILL
            if time.monotonic() >= end:
                break
            time.sleep(0.05)
        return None

    def stop(self, timeout: float = 10.0) -> None:
        """End the starter: it kills the peers still running (a launcher stops them first) and exits."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphaned fork is reaped by whoever adopted it, maybe not at once)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


# ---- the starter's side ------------------------------------------------------------------------------------------
def serve() -> int | None:
    """The starter's loop; returns None when its input ends (in the starter), or a peer's exit code (in a fork, which
    has run the peer: the caller exits with it)."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl+C is for the peers and the launcher
    for name in _PRELOAD:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()  # what the imports allocated stays shared with the forks (a collection would write every page)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing else of the starter's writes into the answers
    starter = os.getpid()
    line = _serve_requests(out)
    if line is None:
        return None
    out.close()  # the fork's copy: the launcher sees the starter's end, not its peers'
    _die_with(starter)
    return _run_peer(line)


def _serve_requests(out) -> bytes | None:
    """Fork a child per request line until the input ends (then None, its children killed); in a child, its line."""
    children: set[int] = set()
    _say(out, {"ready": True})
    buffered = b""
    try:
        while True:
            readable, _, _ = select.select([0], [], [], 0.1)
            _reap(children, out)
            if not readable:
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return None
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                pid = _fork(line, out)
                if pid == 0:
                    children.clear()  # the starter's, not this peer's
                    return line
                if pid > 0:
                    children.add(pid)
    finally:
        _kill_all(children, out)


def _say(out, msg: dict) -> None:
    with contextlib.suppress(OSError):
        out.write(json.dumps(msg) + "\n")


def _fork(line: bytes, out) -> int:
    """Fork for one request: 0 in the child, its pid in the starter, -1 if the request was refused."""
    try:
        request = json.loads(line)
        if not (isinstance(request.get("argv"), list) and isinstance(request.get("env"), dict)
                and isinstance(request.get("out"), str)):
            raise ValueError("want argv (list), env (object), out (path)")
    except ValueError as e:
        _say(out, {"error": f"bad request: {e}"})
        return -1
    try:
        pid = os.fork()
    except OSError as e:
        _say(out, {"error": str(e)})
        return -1
    if pid > 0:
        _say(out, {"started": pid})
    return pid


def own_hivemind_locks() -> None:
    """Give this process hivemind's process-wide locks of its own, before anything of hivemind runs in it.

    hivemind makes them when it is imported, so every process forked after the import shares them. A peer's DHT
    process sends each result to its peer under one of them (`MPFuture._update_lock`): in a swarm forked from one
    starter, a peer killed or frozen (SIGSTOP) while its DHT process held it stopped every other peer's DHT for good
    (each read timed out, each joiner hung starting its DHT) while gossip and streams went on. With its own, a peer
    shares them only with its own DHT and averager processes, which is what they are for."""
    import multiprocessing

    from hivemind.utils.asyncio import _AsyncContextWrapper
    from hivemind.utils.mpfuture import MPFuture

    MPFuture.reset_backend()  # its initialization and update locks, and SharedBytes' lock
    _AsyncContextWrapper.EXECUTOR_LOCK = multiprocessing.Lock()  # taken once per process, as briefly: same hazard


def _run_peer(line: bytes) -> int:
    """In the fork: become the peer of this request and run it; its exit code."""
    own_hivemind_locks()
    request = json.loads(line)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fd = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    argv = [str(a) for a in request["argv"]]
    sys.argv = ["-c", *argv]
    sys.orig_argv = [*python_entry("peer_main"), *argv]  # a restart (os.execv) starts the peer cold
    from swarm.cli.main import peer_main

    try:
        peer_main.main(args=argv, prog_name="skippipe-peer")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _die_with(starter: int) -> None:
    """SIGKILL this fork when the `starter` process ends, however it ends (PR_SET_PDEATHSIG), as a cold peer's
    helpers die with it: a starter killed with its launcher leaves no peer behind."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        return  # refused: the starter's end of input still stops its peers
    if os.getppid() != starter:  # it ended before the call
        os.kill(os.getpid(), signal.SIGKILL)


def _reap(children: set[int], out) -> None:
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            children.discard(pid)
            continue
        if done:
            children.discard(pid)
            _say(out, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _kill_all(children: set[int], out) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
            _say(out, {"exited": pid, "code": -signal.SIGKILL})
