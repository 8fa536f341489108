"""Reaper: a node's helpers (its DHT process, p2pd, any child) die with it, even on SIGKILL; a clean stop kills nothing
else. Real processes throughout: each test runs a small 'node' script in a child process."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from swarm.net.reaper import unix_socket_paths

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
KILLS_MID_SCAN = 6
"""Nodes killed while their watchdog scans without pause: most deaths land inside a scan."""

DHT_NODE = """
import socket, sys, tempfile, time
import hivemind
from swarm.net.reaper import Reaper
reaper = Reaper.start() if sys.argv[1] == "reaper first" else None
dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
own = socket.socket(socket.AF_UNIX)  # a socket of the node itself, as a transport's p2p client listens on
own_path = tempfile.mktemp(prefix="reaper-test-", suffix=".sock")
own.bind(own_path)
own.listen()
reaper = reaper or Reaper.start()
assert reaper.watch()
print("ready", reaper.pid, own_path, flush=True)
time.sleep(600)
"""

HELPER_NODE = """
import subprocess, sys, time
import psutil
from swarm.net.reaper import Reaper
SLEEP = "import time; time.sleep(600)"
# a helper with a child of its own, started before the watchdog (found by its first scan)
helper = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                           f"{SLEEP!r}]); {SLEEP}"])
while not psutil.Process(helper.pid).children():
    time.sleep(0.05)
reaper = Reaper.start()
late = subprocess.Popen([sys.executable, "-c", SLEEP])  # started after: watch() finds it
assert reaper.watch()
print("ready", reaper.pid, flush=True)
line = sys.stdin.readline().strip()
if line == "exit":
    sys.exit(0)  # no stop(): the pipe closes as the interpreter exits
if line == "stop helpers first":  # as a node should before stop(): nothing is left to sweep
    tree = [p for p in psutil.Process().children(recursive=True) if p.pid != reaper.pid]
    for p in tree:
        p.kill()
    helper.wait(10), late.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.is_running() and p.status() != "zombie" for p in tree):
        time.sleep(0.05)  # the helper's child is an orphan now: not ours to reap
reaper.stop()
reaper.stop()  # idempotent
assert reaper.watch() is False  # after stop: a no-op, never an error
print("stopped", reaper._proc.returncode, flush=True)
time.sleep(600)
"""

SHARER_NODE = """
import socket, time
from multiprocessing import resource_sharer, util
from swarm.net.reaper import Reaper
reaper = Reaper.start(scan_interval=600)  # no scan after this one: the listener below is never seen
sock = socket.socket()
shared = resource_sharer.DupFd(sock.fileno())  # multiprocessing's resource sharer listens in its temp dir now
print("ready", reaper.pid, util.get_temp_dir(), flush=True)
time.sleep(600)
"""

SCANNING_NODE = """
import socket, subprocess, sys, tempfile, time
from swarm.net.reaper import Reaper
helpers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
own = socket.socket(socket.AF_UNIX)  # the node's own, as a transport's p2p client listens on
own_path = tempfile.mktemp(prefix="reaper-test-", suffix=".sock")
own.bind(own_path)
own.listen()
reaper = Reaper.start(scan_interval=0.0)  # it scans without pause: a death lands in the middle of a scan
assert reaper.watch()
print("ready", reaper.pid, own_path, flush=True)
time.sleep(600)
"""


# ---- helpers ---------------------------------------------------------------------------------------------------
def _start(code: str, tmp_path: Path, *args: str) -> subprocess.Popen:
    with open(tmp_path / "node.err", "ab") as err:
        return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True)


def _line(node: subprocess.Popen, tmp_path: Path, expect: str, timeout: float = 90) -> list[str]:
    """The next line the node prints (which must start with ``expect``), split into words."""
    assert node.stdout is not None
    ready = select.select([node.stdout], [], [], timeout)[0]
    line = node.stdout.readline() if ready else ""
    if not line.startswith(expect):
        pytest.fail(f"node printed {line!r}, not {expect!r}; its stderr:\n{(tmp_path / 'node.err').read_text()}")
    return line.split()


def _alive(proc: psutil.Process) -> bool:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(proc.pid, os.WNOHANG)  # an orphan re-parented to this test process (a subreaper)
            return False
        return proc.is_running()
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in procs if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _stop(procs: list[psutil.Process]) -> None:
    """Terminate, then kill, exactly these processes (psutil refuses to signal a reused pid)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        if not (procs := _wait_gone(procs, 10)):
            return


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# ---- tests -----------------------------------------------------------------------------------------------------
@pytest.mark.timeout(150)
@pytest.mark.parametrize("order", ["dht first", "reaper first"])  # then the forked DHT holds the pipe: no EOF
def test_a_killed_owner_takes_its_dht_and_p2pd_along(tmp_path, order):
    node = _start(DHT_NODE, tmp_path, order)
    started = _tree(node.pid)
    try:
        _, watchdog_pid, own_socket = _line(node, tmp_path, "ready")
        watchdog_pid = int(watchdog_pid)
        started = _tree(node.pid)
        watchdog = next(p for p in started if p.pid == watchdog_pid)
        helpers = [p for p in started[1:] if p.pid != watchdog_pid]
        names = [p.name() for p in helpers]
        assert len(helpers) >= 2 and "p2pd" in names, names  # the DHT process and its p2pd (maybe torch's helper)
        sockets = set().union(*(unix_socket_paths(p.pid) for p in helpers))
        assert any(Path(s).name.startswith("hivemind-p2pd-") for s in sockets), sockets

        node.send_signal(signal.SIGKILL)  # the owner only: it cannot clean up after itself
        node.wait(10)
        left = _wait_gone([*helpers, watchdog], 15)
        assert not left, f"still running: {[(p.pid, p.name()) for p in left]}"
        assert not [s for s in sockets if os.path.exists(s)]  # p2pd's socket too, though p2pd may have died hard
        assert not os.path.exists(own_socket)  # and the node's own, which it could not remove itself
    finally:
        _stop(started)
        node.wait(10)


@pytest.mark.timeout(60)
def test_a_killed_owner_leaves_no_multiprocessing_directory_though_its_socket_came_after_the_last_scan(tmp_path):
    node = _start(SHARER_NODE, tmp_path)
    started = _tree(node.pid)
    try:
        _, watchdog_pid, temp_dir = _line(node, tmp_path, "ready")
        started = _tree(node.pid)
        sockets = [s for s in unix_socket_paths(node.pid) if Path(s).parent == Path(temp_dir)]
        assert sockets, "the resource sharer did not listen in the temporary directory"
        node.send_signal(signal.SIGKILL)
        node.wait(10)
        assert not _wait_gone([psutil.Process(int(watchdog_pid))], 15)
        assert not os.path.exists(temp_dir), os.listdir(temp_dir)
    finally:
        _stop(started)
        node.wait(10)


@pytest.mark.timeout(120)
def test_an_owner_killed_in_the_middle_of_a_scan_still_takes_its_helpers_and_socket_along(tmp_path):
    """A death seen half-way through a scan (its children re-parented, its /proc gone) leaves the last whole scan
    standing: before, such a scan replaced it with nothing, and the helpers and the node's socket stayed (a
    `crash-mid-average` peer's DHT process and p2pd, once in a CI run)."""
    for _ in range(KILLS_MID_SCAN):
        node = _start(SCANNING_NODE, tmp_path)
        started = _tree(node.pid)
        try:
            _, watchdog_pid, own_socket = _line(node, tmp_path, "ready")
            started = _tree(node.pid)
            helpers = [p for p in started[1:] if p.pid != int(watchdog_pid)]
            assert len(helpers) == 2
            node.send_signal(signal.SIGKILL)
            node.wait(10)
            assert not _wait_gone(helpers, 15), "a helper outlived its node"
            assert not _wait_gone([psutil.Process(int(watchdog_pid))], 15)
            assert not os.path.exists(own_socket), "the node's socket was left behind"
        finally:
            _stop(started)
            node.wait(10)


@pytest.mark.timeout(60)
def test_a_clean_stop_kills_nothing_else(tmp_path):
    sibling = subprocess.Popen(SLEEPER)  # not the node's descendant: must survive
    node = _start(HELPER_NODE, tmp_path)
    started = [psutil.Process(sibling.pid), *_tree(node.pid)]
    try:
        watchdog_pid = int(_line(node, tmp_path, "ready")[1])
        started = [psutil.Process(sibling.pid), *_tree(node.pid)]
        node.stdin.write("stop helpers first\n")
        node.stdin.flush()
        assert _line(node, tmp_path, "stopped") == ["stopped", "0"]  # the watchdog exited, and on its own
        assert not psutil.pid_exists(watchdog_pid) or psutil.Process(watchdog_pid).ppid() != node.pid
        assert node.poll() is None and sibling.poll() is None  # neither the owner nor a stranger was touched
        assert [p.pid for p in _tree(node.pid) if _alive(p)] == [node.pid]
        assert "stopping" not in (tmp_path / "node.err").read_text()  # the watchdog found nothing to stop
    finally:
        _stop(started)
        node.wait(10)
        sibling.wait(10)


@pytest.mark.timeout(60)
def test_stop_sweeps_helpers_left_running_but_not_the_owner(tmp_path):
    node = _start(HELPER_NODE, tmp_path)
    started = _tree(node.pid)
    try:
        watchdog_pid = int(_line(node, tmp_path, "ready")[1])
        started = _tree(node.pid)
        helpers = [p for p in started[1:] if p.pid != watchdog_pid]
        assert len(helpers) == 3  # the helper, its child, the late helper
        node.stdin.write("stop\n")  # without stopping the helpers first
        node.stdin.flush()
        assert _line(node, tmp_path, "stopped") == ["stopped", "0"]
        assert not _wait_gone(helpers, 5)
        assert node.poll() is None
        assert "asked to stop: stopping" in (tmp_path / "node.err").read_text()
    finally:
        _stop(started)
        node.wait(10)


@pytest.mark.timeout(60)
def test_an_owner_exiting_without_stop_takes_its_helpers_along(tmp_path):
    node = _start(HELPER_NODE, tmp_path)
    started = _tree(node.pid)
    try:
        watchdog_pid = int(_line(node, tmp_path, "ready")[1])
        started = _tree(node.pid)
        node.stdin.write("exit\n")
        node.stdin.flush()
        assert node.wait(20) == 0
        assert not _wait_gone([p for p in started[1:]], 15)  # helpers and the watchdog
        assert not psutil.pid_exists(watchdog_pid) or not _alive(psutil.Process(watchdog_pid))
    finally:
        _stop(started)
        node.wait(10)


@pytest.mark.timeout(30)
def test_the_watchdog_refuses_a_parent_that_is_not_its_own():
    stranger = subprocess.Popen(SLEEPER)
    try:
        done = subprocess.run([sys.executable, "-m", "swarm.net.reaper", "--parent", str(stranger.pid)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
        assert done.returncode == 2 and "not this process's parent" in done.stderr
        assert stranger.poll() is None
    finally:
        _stop([psutil.Process(stranger.pid)])
        stranger.wait(10)


@pytest.mark.timeout(30)
def test_the_watchdog_refuses_a_directory_that_is_not_multiprocessings(tmp_path):
    done = subprocess.run([sys.executable, "-m", "swarm.net.reaper", "--parent", str(os.getpid()),
                           "--mp-temp-dir", str(tmp_path)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=20)
    assert done.returncode == 2 and "not a multiprocessing temporary directory" in done.stderr
    assert tmp_path.exists()
