"""End to end: peers started by hand on one machine, as a new user would, without --identity.

They get distinct identities (identity.key, identity-2.key), share the cores, print one console line per
iteration, and, asked to stop once the coordinator is dead with nobody left to succeed it, leave within seconds
(a `stopped` event saying why) instead of draining for two minutes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from swarm.events import read_events
from swarm.local.local_swarm import LocalSwarm
from swarm.local.warm_start import python_entry
from swarm.peer.host_share import available_cpus, threads_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STOP_WITHIN = 20.0
"""Seconds a peer asked to stop may take with no scheduler: the dead one's record expires (3 heartbeats of 1 s),
it is taken for silent (2 s more), then the peer shuts down."""


def test_two_peers_without_identity_train_and_leave_quickly_once_the_scheduler_is_dead(tmp_path):
    home = tmp_path / "home"
    config = tmp_path / "run.toml"
    config.write_text("[run]\nrun_id = 'hand'\nstages = 2\nskip = 0.0\nmicrobatches = 1\niterations = 1000\n"
                      "min_peers = 2\n[swarm]\nheartbeat = 1.0\n")
    swarm = LocalSwarm(tmp_path / "run", 0, run_id="hand", coordinator_args=["--config", str(config)])
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["HOME"] = str(home)  # the default identity and the host registry live under ~/.skippipe
    peers: list[subprocess.Popen] = []
    started = time.monotonic()
    try:
        swarm.start()
        env["SKIPPIPE_JOIN_TOKEN"] = swarm.join_token
        for i in range(2):
            out = open(tmp_path / f"hand-{i}.out", "wb")  # noqa: SIM115 (the child's)
            peers.append(subprocess.Popen(
                python_entry("peer_main") + ["join", "--run", "hand", "--initial-peers", swarm.initial_peers[0],
                                        "--log-file", str(tmp_path / f"hand-{i}.log"),
                                        "--events", str(tmp_path / f"hand-{i}.events.jsonl")],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
            out.close()
        swarm.peers = peers  # watched (a failed peer fails the wait) and stopped with the run
        swarm.watch(2, timeout=180)
        print(f"trained 2 iterations {time.monotonic() - started:.1f} s after the start")

        keys = sorted(p.name for p in (home / ".skippipe").glob("identity*.key"))
        assert keys == ["identity-2.key", "identity.key"]
        nodes = {e["node"] for i in range(2) for e in read_events(tmp_path / f"hand-{i}.events.jsonl")}
        assert len(nodes) == 2, "two peer ids"
        for i in range(2):
            log = (tmp_path / f"hand-{i}.log").read_text()
            assert f"torch uses {threads_for(available_cpus(), 2)} thread(s)" in log  # a share, not every core
            console = (tmp_path / f"hand-{i}.out").read_text()
            assert "  stage " in console and " tokens/s  epoch " in console, console[-2000:]

        swarm.kill(swarm.coordinator)
        t0 = time.monotonic()
        for p in peers:
            p.send_signal(signal.SIGTERM)
        for p in peers:
            p.wait(timeout=60)
        took = time.monotonic() - t0
        print(f"asked to stop with the scheduler dead, the peers left within {took:.1f} s")
        assert took < STOP_WITHIN, f"the peers took {took:.1f} s to stop"
        assert [p.returncode for p in peers] == [0, 0]
        stopped = [e for i in range(2) for e in read_events(tmp_path / f"hand-{i}.events.jsonl")
                   if e["event"] == "stopped"]
        assert [e["why"] for e in stopped] == ["scheduler silent"] * 2, stopped
    finally:
        swarm.stop()
