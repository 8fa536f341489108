"""Gossip sidecars forked by a sidecar starter: they gossip like cold ones, the launcher knows whose each one is, they
end with their owner (whose child they are not), and a request that is not a good one is refused while the starter
goes on forking."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from swarm.control.gossip import GossipClient, schedule_topic
from swarm.control.sidecar_starter import REQUEST_TIMEOUT, SIDECAR_STARTER_ENV, SidecarStarter
from swarm.net.identity import ensure_identity
from tests.utils.waiting import wait_for

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[3]
TOPIC = schedule_topic("test-starter")


@pytest.fixture
def starter(tmp_path, monkeypatch):
    started = SidecarStarter(log=tmp_path / "starter.log")
    try:
        assert started.wait_ready(), (tmp_path / "starter.log").read_text()
        monkeypatch.setenv(SIDECAR_STARTER_ENV, started.name)
        yield started
    finally:
        started.stop()


def key(tmp_path: Path, name: str) -> str:
    path = str(tmp_path / f"{name}.key")
    ensure_identity(path)
    return path


def test_forked_sidecars_gossip_and_the_launcher_knows_whose_they_are(starter, tmp_path):
    with GossipClient() as a, GossipClient() as b:
        info = a.start(key(tmp_path, "a"), log_path=str(tmp_path / "a.log"))
        b.start(key(tmp_path, "b"), log_path=str(tmp_path / "b.log"), bootstrap=[info.maddrs[0]])
        pids = {a.pid, b.pid}
        assert {psutil.Process(pid).ppid() for pid in pids} == {starter.proc.pid}  # forked, not started cold
        wait_for(lambda: starter.of(os.getpid()) == pids, 10, "the starter said whose both sidecars are")
        for client in (a, b):
            client.subscribe(TOPIC)
        a.wait_for_mesh(TOPIC, 1, timeout=10)
        a.publish(TOPIC, {"epoch": 1})
        message = b.receive(timeout=10)
        assert message.payload == {"epoch": 1} and message.sender == info.peer_id
    assert not any(psutil.pid_exists(p) for p in pids)  # close() ended them (by pidfd) and the starter reaped them
    wait_for(lambda: starter.of(os.getpid()) == set(), 10, "the starter said both ended")
    assert "listening at" in (tmp_path / "a.log").read_text()  # the fork logs to its owner's file


OWNER = '''
import json, os, sys, time
from swarm.control.gossip import GossipClient
client = GossipClient()
client.start(sys.argv[1], log_path=sys.argv[2])
child = os.fork()  # inherits the owner's end of the pipe, as hivemind's forked processes do: the pipe stays open
if child == 0:
    time.sleep(60)
    os._exit(0)
print(json.dumps({"sidecar": client.pid, "child": child}), flush=True)
time.sleep(60)
'''


def test_a_forked_sidecar_ends_when_its_owner_is_killed(starter, tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(OWNER), key(tmp_path, "o"),
                              str(tmp_path / "o.log")], stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, SIDECAR_STARTER_ENV: starter.name})
    child = None
    try:
        started = json.loads(owner.stdout.readline())
        sidecar, child = started["sidecar"], started["child"]
        wait_for(lambda: starter.of(owner.pid) == {sidecar}, 10, "the starter said whose the sidecar is")
        os.kill(owner.pid, signal.SIGKILL)  # no close(): its sidecar, not its child, must notice by itself
        owner.wait(5)
        wait_for(lambda: not psutil.pid_exists(sidecar), 10, "the sidecar to end with its owner")
        assert f"owner {owner.pid} is gone" in (tmp_path / "o.log").read_text()
        wait_for(lambda: starter.of(owner.pid) == set(), 10, "the starter said it ended")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(5)
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)  # an orphan: the leak check reaps it


def ask(name: str, data: bytes, fds: list[int], timeout: float = REQUEST_TIMEOUT + 5) -> dict | None:
    """Send raw `data` (with `fds` attached) to the starter and read its answer; None if it closed without one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect("\0" + name)
        if fds:
            socket.send_fds(conn, [data], fds)
        else:
            conn.sendall(data)
        line = b""
        while b"\n" not in line:
            chunk = conn.recv(4096)
            if not chunk:
                return None
            line += chunk
        return json.loads(line.split(b"\n")[0])


@pytest.mark.parametrize("request_line, attach, why", [
    (b'{"args": ["--identity", "k", "--fd", "0"]}\n', True, "starter's to set"),
    (b'{"args": ["--owner", "1"]}\n', True, "starter's to set"),  # an abbreviation argparse would take
    (b'{"args": "--identity k"}\n', True, "want"),
    (b'not json\n', True, "bad request"),
    (b'{"args": []}\n', False, "want 2 descriptors"),
    (b'{"args": [', True, "in time"),  # never finished
])
def test_a_bad_request_is_refused_and_the_starter_goes_on(starter, tmp_path, request_line, attach, why):
    ours, theirs = socket.socketpair()
    with ours, theirs, open(tmp_path / "log", "ab") as log:
        answer = ask(starter.name, request_line, [theirs.fileno(), log.fileno()] if attach else [])
    assert answer is not None and why in answer["error"], answer
    assert starter.of(os.getpid()) == set()
    with GossipClient() as client:  # the next owner is served
        client.start(key(tmp_path, "next"), log_path=str(tmp_path / "next.log"))
        assert psutil.Process(client.pid).ppid() == starter.proc.pid


def test_an_owner_whose_starter_is_gone_starts_its_sidecar_cold(tmp_path, monkeypatch):
    monkeypatch.setenv(SIDECAR_STARTER_ENV, "skippipe-sidecars-nobody-listens-here")
    with GossipClient() as client:
        client.start(key(tmp_path, "cold"), log_path=str(tmp_path / "cold.log"))
        assert psutil.Process(client.pid).ppid() == os.getpid()
        client.subscribe(TOPIC)


def test_stopping_the_starter_ends_the_sidecars_it_forked(tmp_path, monkeypatch):
    starter = SidecarStarter(log=tmp_path / "starter.log")
    try:
        assert starter.wait_ready()
        monkeypatch.setenv(SIDECAR_STARTER_ENV, starter.name)
        client = GossipClient()
        client.start(key(tmp_path, "left"), log_path=str(tmp_path / "left.log"))
        pid = client.pid
    finally:
        starter.stop()
    assert starter.proc.returncode == 0
    assert not psutil.pid_exists(pid)  # killed and reaped by the starter before it exited
    started = time.monotonic()
    client.close()  # its sidecar is gone already: nothing to wait for
    assert time.monotonic() - started < 5


def test_a_forked_sidecar_outlives_a_starter_that_crashed(tmp_path, monkeypatch):
    starter = SidecarStarter(log=tmp_path / "starter.log")
    try:
        assert starter.wait_ready()
        monkeypatch.setenv(SIDECAR_STARTER_ENV, starter.name)
        with GossipClient() as client:
            client.start(key(tmp_path, "owner"), log_path=str(tmp_path / "owner.log"))
            pid = client.pid
            starter.proc.kill()  # no word to anyone: its sidecars are orphans now
            starter.proc.wait(5)
            client.subscribe(TOPIC)  # the sidecar serves its owner all the same
            assert client.status()["peer_id"] == client.peer_id
            started = time.monotonic()
        assert time.monotonic() - started < 5  # closed through the pipe, ended seen through its pidfd
        wait_for(lambda: ended(pid), 5, "the orphaned sidecar to end")
    finally:
        starter.stop()


def ended(pid: int) -> bool:
    """Exited: gone, or an orphan's zombie waiting for the subreaper (this test process) to reap it."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
