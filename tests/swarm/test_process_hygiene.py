"""`kill -9` of a peer's or the coordinator's main process leaves none of its helpers alive: hivemind's DHT
process, its p2pd, the gossip sidecar and the reaper itself all go (`swarm.net.reaper`), and the run's other
processes are untouched. The peers are forked from a warm starter (`swarm.local.warm_start`): one that dies takes
its peers, and so their helpers, with it. The gossip sidecars are forked from a sidecar starter
(`swarm.control.sidecar_starter`), not by their nodes: each goes with its node all the same."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from swarm.local.local_swarm import LocalSwarm
from swarm.net.reaper import unix_socket_paths

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def helpers(swarm: LocalSwarm, pid: int) -> list[psutil.Process]:
    """Node `pid`'s helpers: its descendants, and the gossip sidecar the sidecar starter forked for it."""
    forked = [psutil.Process(s) for s in swarm.sidecars.of(pid)] if swarm.sidecars is not None else []
    return psutil.Process(pid).children(recursive=True) + forked


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_helpers(swarm: LocalSwarm, pid: int, timeout: float = 120) -> list[psutil.Process]:
    """The helpers of node `pid` once its DHT's p2pd, its forked gossip sidecar and its reaper all run."""
    end = time.monotonic() + timeout
    while True:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs = helpers(swarm, pid)
            cmds = [" ".join(p.cmdline()) for p in procs if alive(p)]
            if all(any(part in c for c in cmds) for part in ("p2pd", "sidecar_starter", "swarm.net.reaper")):
                return procs
        assert time.monotonic() < end, f"node {pid} never started all its helpers: {cmds}"
        time.sleep(0.5)


def test_kill_9_of_a_peer_and_of_the_coordinator_leaves_no_helper_behind(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[run]\nrun_id = 'hygiene'\nstages = 2\nskip = 0.0\nmicrobatches = 1\niterations = 1000\n"
                      "min_peers = 2\n[swarm]\nheartbeat = 1.0\n")
    swarm = LocalSwarm(tmp_path / "run", 2, run_id="hygiene", coordinator_args=["--config", str(config)])
    try:
        swarm.start()
        swarm.watch(1, timeout=180)  # everyone is up and training
        for victim in (swarm.peers[0], swarm.coordinator):
            left = wait_for_helpers(swarm, victim.pid)
            bystanders = [p for p in helpers(swarm, swarm.peers[1].pid) if alive(p)]
            # multiprocessing's temporary directory, where the node's resource sharer listens: the node removes it
            # at exit, the reaper after a kill
            mp_dirs = {Path(s).parent for s in unix_socket_paths(victim.pid)}
            mp_dirs = {d for d in mp_dirs if d.name.startswith("pymp-")}
            os.kill(victim.pid, signal.SIGKILL)
            assert victim.wait(timeout=10) == -signal.SIGKILL
            end = time.monotonic() + 20
            while any(alive(p) for p in left) and time.monotonic() < end:
                time.sleep(0.2)
            assert not [p.cmdline() for p in left if alive(p)], "helpers outlived their node"
            assert all(alive(p) for p in bystanders), "another peer's helpers were touched"
            while any(d.exists() for d in mp_dirs) and time.monotonic() < end:
                time.sleep(0.2)
            assert not [d for d in mp_dirs if d.exists()], "the killed node's multiprocessing directory stayed"
        assert swarm.starter is not None, "the peers were not forked warm"
        survivor = swarm.peers[1]
        left = wait_for_helpers(swarm, survivor.pid)
        sockets = [s for p in [survivor.pid, *(h.pid for h in left)] for s in unix_socket_paths(p)]
        swarm.starter.proc.kill()  # as if killed with its launcher
        assert survivor.wait(timeout=20) == -signal.SIGKILL
        for path in sockets:  # what a process killed with -9 cannot remove (LocalSwarm.kill does the same)
            if Path(path).name.startswith("hivemind-"):
                Path(path).unlink(missing_ok=True)
        end = time.monotonic() + 20
        while any(alive(p) for p in left) and time.monotonic() < end:
            time.sleep(0.2)
        assert not [p.cmdline() for p in left if alive(p)], "a forked peer's helpers outlived the starter"
    finally:
        swarm.stop()
