"""`LocalSwarm`: a coordinator and N peers as separate processes on loopback, for the demo, tests and benchmarks.

Each process is the real thing (`skippipe coordinator start`, `skippipe-peer join`), with its own key, its own
DHT node, p2pd and gossip sidecar, logging to the run directory. On loopback the peers are forked from a warm
starter (`swarm.local.warm_start`), which imported what they import once, and the gossip sidecars of the peers and
the coordinator from a sidecar starter (`swarm.control.sidecar_starter`), which imported py-libp2p once. The
launcher remembers the processes it started and stops only those, by pid: Ctrl+C (SIGINT) first, so peers announce
that they leave, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarm.control.sidecar_starter import SIDECAR_STARTER_ENV, SidecarStarter
from swarm.events import read_events
from swarm.local.interrupts import deferred_interrupts
from swarm.local.warm_start import WarmProcess, WarmStarter, python_entry
from swarm.net.reaper import unix_socket_paths, unlink_if_dead
from swarm.report.run_dir import committed_records

if TYPE_CHECKING:
    from swarm.local.emulated_network import EmulatedNetwork

logger = logging.getLogger(__name__)

START_TIMEOUT = 120.0


Started = subprocess.Popen | WarmProcess
"""A process the launcher started: a cold one, or a peer forked by the warm starter."""


def _suspended_tree(pid: int) -> list:
    """Process `pid` and all its descendants, each stopped (SIGSTOP) before its children are listed: one forked
    meanwhile (a hivemind helper starting) is then listed too, and its sockets are found before the kill."""
    import psutil

    tree, todo = [], [pid]
    while todo:
        try:
            p = psutil.Process(todo.pop())
            p.suspend()
            tree.append(p)
            todo += [c.pid for c in p.children() if c.pid not in {q.pid for q in tree}]
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone already, or not ours: nothing to stop
            continue
    return tree


class LocalSwarm:
    """Start, watch and stop a local run.

    :param coordinator_args: extra `skippipe coordinator start` flags (e.g. ["--config", "run.toml"])
    :param peer_args: extra `skippipe-peer join` flags for each peer (one list per peer, or one for all)
    :param network: run peer i in host i of this (started) emulated network, the coordinator on its bridge
    :param warm_start: fork the peers from one process that imported what they import (`WarmStarter`: seconds of
      CPU less per peer), and the gossip sidecars from another (`SidecarStarter`); not for peers in an emulated
      network's hosts, nor where a cold peer's own footprint is what is measured
    """

    def __init__(self, run_dir: str | Path, num_peers: int, *, run_id: str, coordinator_args: Sequence[str] = (),
                 peer_args: Sequence[Sequence[str]] | Sequence[str] = (), host: str = "127.0.0.1",
                 env: dict[str, str] | None = None, network: EmulatedNetwork | None = None,
                 warm_start: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.num_peers, self.run_id, self.network = num_peers, run_id, network
        self.host = network.gateway if network is not None else host
        self.coordinator_args = list(coordinator_args)
        if peer_args and isinstance(peer_args[0], str):
            peer_args = [list(peer_args)] * num_peers  # type: ignore[list-item]
        self.peer_args: list[list[str]] = [list(a) for a in peer_args] or [[] for _ in range(num_peers)]
        # N processes share this machine's cores: one compute thread each (OMP and --threads 1), unless the caller
        # says otherwise (a later --threads in peer_args wins)
        self.env = {"OMP_NUM_THREADS": "1", **os.environ, **(env or {})}
        self.coordinator: subprocess.Popen | None = None
        self.peers: list[Started] = []
        self.warm_start = warm_start and network is None
        self.starter: WarmStarter | None = None
        """The process the peers are forked from (with `warm_start`, once started)."""
        self.sidecars: SidecarStarter | None = None
        """The process the gossip sidecars are forked from (with `warm_start`, once started)."""
        self.initial_peers: list[str] = []
        self.join_token: str | None = None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        """Where the coordinator (and any peer that succeeds it) writes the run's metrics."""

    # ---- processes --------------------------------------------------------------------------------
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        address = self.run_dir / "coordinator.json"
        address.unlink(missing_ok=True)
        if self.warm_start and self.sidecars is None:  # listening long before the coordinator's sidecar starts
            self.sidecars = SidecarStarter(self.env, log=self.run_dir / "sidecar-starter.log")
            self.env[SIDECAR_STARTER_ENV] = self.sidecars.name
        if self.warm_start and self.starter is None:  # imports while the coordinator starts
            self.starter = WarmStarter(self.env, log=self.run_dir / "warm-starter.log")
        self.coordinator = self._spawn(
            python_entry("main") + ["coordinator", "start", "--run-id", self.run_id, "--host", self.host,
                                    "--identity", str(self.run_dir / "coordinator.key"),
                                    "--run-dir", str(self.run_dir),
                                    "--log-file", str(self.run_dir / "coordinator.log"),
                                    "--events", str(self.run_dir / "coordinator.events.jsonl"),
                                    *self.coordinator_args],
            "coordinator")
        deadline = time.monotonic() + START_TIMEOUT
        while not address.exists():
            if self.coordinator.poll() is not None:
                raise RuntimeError(f"the coordinator exited with {self.coordinator.returncode}; see "
                                   f"{self.run_dir / 'coordinator.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError("the coordinator did not start in time")
            time.sleep(0.2)
        started = json.loads(address.read_text())
        self.initial_peers, self.join_token = started["initial_peers"], started.get("join_token")
        for i in range(self.num_peers):
            self.add_peer(i)

    def add_peer(self, index: int, extra: Sequence[str] = ()) -> Started:
        args = self.peer_args[index] if index < len(self.peer_args) else []
        prefix, host = [], self.host
        if self.network is not None:
            if index >= self.network.num_hosts:
                raise ValueError(f"the emulated network has {self.network.num_hosts} hosts, no host for peer {index}")
            prefix, host = self.network.exec_prefix(index), self.network.host(index)
        join = ["join", "--run", self.run_id, "--host", host, "--initial-peers", self.initial_peers[0],
                "--identity", str(self.run_dir / f"peer-{index:02d}.key"),
                "--log-file", str(self.run_dir / f"peer-{index:02d}.log"),
                "--events", str(self.run_dir / f"peer-{index:02d}.events.jsonl"),
                "--metrics", str(self.metrics_path),
                "--trace", str(self.run_dir / f"peer-{index:02d}.trace.jsonl"),
                "--threads", "1", *args, *extra]
        name = f"peer-{index:02d}"
        if self.starter is not None and not prefix:
            proc: Started = self.starter.spawn(join, self._env(self.join_token), self.run_dir / f"{name}.out")
            logger.info("started %s (pid %d, forked warm)", name, proc.pid)
        else:
            proc = self._spawn(prefix + python_entry("peer_main") + join, name, token=self.join_token)
        self.peers.append(proc)
        return proc

    def _env(self, token: str | None) -> dict[str, str]:
        return {**self.env, **({"SKIPPIPE_JOIN_TOKEN": token} if token else {})}

    def _spawn(self, cmd: list[str], name: str, token: str | None = None) -> subprocess.Popen:
        """Start `cmd` as process `name`; a peer gets the run's join token in its environment (not on its command
        line, which every user of the host can read)."""
        out = open(self.run_dir / f"{name}.out", "ab")  # noqa: SIM115 (owned by the child; closed on stop)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self._env(token))
        out.close()
        logger.info("started %s (pid %d)", name, proc.pid)
        return proc

    def kill(self, proc: Started) -> None:
        """SIGKILL a process and everything it started (its p2pd, its gossip sidecar): a machine that dies.

        A killed process cannot remove its unix sockets (hivemind's p2pd control sockets), so this does.
        """
        import psutil

        victims = self._suspended_host(proc)
        if not victims:
            return
        sockets = set()
        try:
            for p in victims:
                sockets |= unix_socket_paths(p.pid)
        finally:  # never leave a stopped tree behind
            for p in victims:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        proc.wait(timeout=10)  # reaped by Popen itself, so that its returncode says -9
        psutil.wait_procs(victims[1:], timeout=10)
        for path in sockets:  # its p2pd's and p2p clients', multiprocessing's listener (and its directory)
            unlink_if_dead(path)

    def freeze(self, proc: Started) -> list:
        """SIGSTOP a process and everything it started: a host that dies silently (nothing is reset, its sockets
        stay open, only timeouts tell). Returns the stopped processes (psutil); `kill` ends them, resumed or not."""
        return self._suspended_host(proc)

    def _suspended_host(self, proc: Started) -> list:
        """`proc`'s process tree, and the sidecars forked for it elsewhere, each stopped (SIGSTOP)."""
        tree = _suspended_tree(proc.pid)
        if self.sidecars is not None:
            for pid in {s for p in tree for s in self.sidecars.of(p.pid)}:
                tree += _suspended_tree(pid)
        return tree

    @property
    def processes(self) -> list[Started]:
        return [p for p in [self.coordinator, *self.peers] if p is not None]

    def stop(self, grace: float = 15.0) -> None:
        """Stop every process this launcher started: SIGINT (graceful leave), then SIGTERM, then SIGKILL.

        A Ctrl+C meanwhile does not cut this short (it is raised once everything is stopped)."""
        with deferred_interrupts():
            self._stop(grace)
            if self.starter is not None:
                self.starter.stop()
                self.starter = None
            if self.sidecars is not None:
                self.sidecars.stop()
                self.sidecars = None
                self.env.pop(SIDECAR_STARTER_ENV, None)

    def _stop(self, grace: float) -> None:
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            alive = [p for p in self.processes if p.poll() is None]
            if not alive:
                return
            for p in alive:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            for p in alive:
                try:
                    p.wait(timeout=max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass

    # ---- progress ---------------------------------------------------------------------------------
    def metrics(self, path: str | Path | None = None) -> list[dict[str, Any]]:
        """The committed iterations' metrics records, oldest first (`committed_records`)."""
        f = Path(path) if path else self.run_dir / "metrics.jsonl"
        if not f.exists():
            return []
        lines = f.read_text().split("\n")[:-1]  # the last piece is empty, or a record still being written
        return committed_records([json.loads(line) for line in lines if line.strip()])

    def events(self, name: str | None = None, *, who: str = "*") -> list[dict[str, Any]]:
        """The typed events (`swarm.events`) the run's processes recorded, oldest first: those named `name` (all
        if None), of the processes matching `who` ("coordinator", "peer-03", "peer-*", or "*" for all)."""
        events = read_events(*sorted(self.run_dir.glob(f"{who}.events.jsonl")))
        return [e for e in events if name is None or e["event"] == name]

    def schedule(self) -> dict[str, Any] | None:
        """The last epoch's schedule the coordinator wrote, or None before the first."""
        schedules = self.schedules()
        return schedules[-1] if schedules else None

    def schedules(self) -> list[dict[str, Any]]:
        """Every epoch's schedule the coordinator wrote, oldest first."""
        files = sorted(self.run_dir.glob("schedule-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        return [json.loads(f.read_text()) for f in files]

    def watch(self, iterations: int, *, metrics_path: str | Path | None = None, timeout: float = 600.0,
              on_record: Callable[[dict[str, Any]], None] | None = None,
              until: Callable[[list[dict[str, Any]]], bool] | None = None) -> list[dict[str, Any]]:
        """Wait until `iterations` iterations are reported (or, sooner, `until` holds of the records after a new one
        came), or the coordinator exits, or every process of the swarm has (fewer records then: the caller sees which
        are missing), calling `on_record` for each new one; raises if a process fails or the run stalls past
        `timeout`."""
        reported: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            records = self.metrics(metrics_path)
            same = next((i for i, (a, b) in enumerate(zip(reported, records)) if a != b),
                        min(len(reported), len(records)))
            for r in records[same:]:  # a superseded record is followed by the one that replaced it
                if on_record:
                    on_record(r)
                deadline = time.monotonic() + timeout
            came, reported = records[same:], records
            if len(records) >= iterations or (came and until is not None and until(records)):
                return records
            dead = [p for p in self.peers if p.poll() not in (None, 0) and p.returncode != -9]
            if dead:
                raise RuntimeError(f"{len(dead)} peer process(es) failed (exit {dead[0].returncode}); logs in "
                                   f"{self.run_dir}")
            if self.coordinator is not None and self.coordinator.poll() is not None and \
                    self.coordinator.returncode != -9:  # a coordinator we killed is succeeded by a peer
                if self.coordinator.returncode != 0:
                    raise RuntimeError(f"the coordinator failed (exit {self.coordinator.returncode}); see "
                                       f"{self.run_dir / 'coordinator.log'}")
                return self.metrics(metrics_path)
            if self.peers and all(p.poll() is not None for p in self.peers) and \
                    (self.coordinator is None or self.coordinator.poll() is not None):
                return self.metrics(metrics_path)  # every process is gone: no record can come any more
            if time.monotonic() > deadline:
                raise TimeoutError(f"no progress for {timeout:.0f} s; logs in {self.run_dir}")
            time.sleep(0.2)
