"""The warm starter forks `skippipe-peer` processes with their own arguments, environment and output, reports how
they ended, refuses a malformed request without stopping, and leaves nothing behind when stopped (the swarm conftest
fails a test that leaks a process). A fork takes hivemind's process-wide locks for its own, so that a sibling
killed or frozen while holding one cannot stop its DHT."""

from __future__ import annotations

import os
import select

import pytest

from swarm.local.warm_start import WarmStarter, own_hivemind_locks

pytestmark = pytest.mark.timeout(180)

PEER = "/ip4/127.0.0.1/tcp/1/p2p/QmYicVwnxLG1JECbJzzPTP5WJ6DyMDYDBecK5jywMayxBt"


@pytest.fixture(scope="module")
def starter(tmp_path_factory):
    s = WarmStarter(log=tmp_path_factory.mktemp("starter") / "warm-starter.log")
    try:
        yield s
    finally:
        s.stop()


def test_a_forked_peer_runs_with_its_own_arguments_environment_and_output(starter, tmp_path):
    bad_stage = starter.spawn(["join", "--initial-peers", PEER, "--stage", "first"], dict(os.environ),
                              tmp_path / "stage.out")
    assert bad_stage.pid != starter.proc.pid
    assert bad_stage.wait(timeout=60) == 2 and bad_stage.poll() == 2
    assert "--stage must be a stage number or auto, got 'first'" in (tmp_path / "stage.out").read_text()
    # the token comes from the environment given with the request, not from the starter's
    bad_token = starter.spawn(["join", "--initial-peers", PEER], {**os.environ, "SKIPPIPE_JOIN_TOKEN": "short"},
                              tmp_path / "token.out")
    assert bad_token.wait(timeout=60) == 2
    assert "a join token is 16-" in (tmp_path / "token.out").read_text()
    assert "join token" not in (tmp_path / "stage.out").read_text()


def test_a_malformed_request_is_refused_and_the_starter_keeps_serving(starter, tmp_path):
    assert "bad request" in starter.request({"argv": "join"})["error"]  # what a broken launcher might write
    again = starter.spawn(["join", "--initial-peers", PEER, "--stage", "x"], dict(os.environ), tmp_path / "x.out")
    assert again.wait(timeout=60) == 2


def test_stopping_the_starter_ends_it(tmp_path):
    s = WarmStarter(log=tmp_path / "warm-starter.log")
    done = s.spawn(["join", "--initial-peers", PEER, "--stage", "x"], dict(os.environ), tmp_path / "x.out")
    assert done.wait(timeout=120) == 2
    s.stop()
    assert s.proc.returncode == 0
    assert "Traceback" not in (tmp_path / "warm-starter.log").read_text()


def _start_a_dht_in_a_fork(own_locks: bool) -> tuple[int, int]:
    """Fork a process that starts a real DHT (its own p2pd) and writes b"ready" once it is up within 5 s, else
    b"stuck" and keeps waiting for it; it shuts the DHT down and exits 0 once up. Returns (pid, read end)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    code = 1
    try:
        os.close(read)
        if own_locks:
            own_hivemind_locks()
        from hivemind import DHT

        dht = DHT(start=False)
        dht.start()
        try:
            dht.wait_until_ready(timeout=5)
            os.write(write, b"ready")
        except TimeoutError:
            os.write(write, b"stuck")
            dht.wait_until_ready(timeout=60)
        dht.shutdown()
        code = 0
    finally:
        os._exit(code)


def _said(fd: int, timeout: float = 60) -> bytes:
    readable, _, _ = select.select([fd], [], [], timeout)
    return os.read(fd, 16) if readable else b"(nothing)"


def test_a_fork_starts_its_dht_while_a_sibling_holds_hivemind_s_locks():
    """The starter's fork path gives each peer hivemind's locks of its own: a fork that takes them starts a real DHT
    while this process holds the lock a DHT process sends its results under (as a sibling peer frozen mid-send
    would); one that shares it stays stuck until the lock is let go."""
    from hivemind.utils.mpfuture import MPFuture

    lock = MPFuture._update_lock
    forks: list[tuple[int, int]] = []
    lock.acquire()
    try:
        forks.append(_start_a_dht_in_a_fork(own_locks=True))
        forks.append(_start_a_dht_in_a_fork(own_locks=False))
        said = [_said(fd) for _, fd in forks]
    finally:
        lock.release()
        codes = []
        for pid, fd in forks:
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            os.close(fd)
    assert said == [b"ready", b"stuck"]
    assert codes == [0, 0]  # each got its DHT up (the second once the lock was let go) and shut it down
