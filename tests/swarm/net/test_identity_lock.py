"""One identity key per live process on a machine: a second claimant gets the next slot, or a clear refusal."""

import os
import signal
import subprocess
import sys
import time

import pytest

from swarm.net.identity_lock import FileLock, IdentityTaken, claim_identity, holder_pid, is_locked, lock_path

HOLD = "import sys, time; from swarm.net.identity_lock import claim_identity; claim_identity(sys.argv[1]); " \
       "print('held', flush=True); time.sleep(60)"


def test_a_second_claim_of_a_taken_key_names_the_holder_and_the_fix(tmp_path):
    key = tmp_path / "identity.key"
    path, lock = claim_identity(key)
    assert path == key and lock.held and holder_pid(lock_path(key)) is not None
    with pytest.raises(IdentityTaken, match=r"identity .*identity.key is in use by process \d+ .*pass a different "
                                            r"--identity FILE"):
        claim_identity(key)
    lock.release()
    assert claim_identity(key)[0] == key  # free again


def test_default_identities_take_the_first_free_numbered_slot(tmp_path):
    key = tmp_path / "identity.key"
    claims = [claim_identity(key, numbered=True) for _ in range(3)]
    assert [p.name for p, _ in claims] == ["identity.key", "identity-2.key", "identity-3.key"]
    claims[1][1].release()
    assert claim_identity(key, numbered=True)[0].name == "identity-2.key"  # a freed slot is reused


def test_another_process_holds_the_key_until_it_exits(tmp_path):
    key = tmp_path / "peer.key"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(key)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert is_locked(lock_path(key))
        with pytest.raises(IdentityTaken, match=f"process {holder.pid} "):
            claim_identity(key)
        assert claim_identity(key, numbered=True)[0].name == "peer-2.key"
    finally:
        holder.kill()  # killed, not stopped: its lock file stays behind, stale
        holder.wait()
    assert lock_path(key).exists() and not is_locked(lock_path(key))
    assert claim_identity(key)[0] == key


def test_a_lock_is_not_taken_twice_in_one_process(tmp_path):
    a, b = FileLock(tmp_path / "x.lock"), FileLock(tmp_path / "x.lock")
    assert a.acquire() and not b.acquire()
    a.release()
    assert b.acquire()


FORK_AND_DIE = "import os, sys, time; from swarm.net.identity_lock import claim_identity\n" \
               "claim_identity(sys.argv[1]); pid = os.fork()\n" \
               "if pid == 0: os.dup2(os.open(os.devnull, os.O_WRONLY), 1); time.sleep(30); os._exit(0)\n" \
               "print(pid, flush=True); os._exit(0)"


def test_a_forked_child_does_not_keep_the_lock_of_a_dead_parent(tmp_path):
    """hivemind's DHT process is a fork of the peer: the key is free once the peer is dead, whatever its DHT does."""
    key = tmp_path / "peer.key"
    parent = subprocess.Popen([sys.executable, "-c", FORK_AND_DIE, str(key)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.wait(timeout=30)
    parent.stdout.close()
    try:
        end = time.monotonic() + 5  # the child closes its copy as it starts running
        while is_locked(lock_path(key)) and time.monotonic() < end:
            time.sleep(0.05)
        os.kill(child, 0)  # the child still lives
        assert not is_locked(lock_path(key))
    finally:
        os.kill(child, signal.SIGKILL)
        try:
            os.waitpid(child, 0)  # reparented to this test process where it is a subreaper
        except ChildProcessError:
            pass
