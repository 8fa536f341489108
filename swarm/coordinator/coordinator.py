"""`Coordinator`: the process that starts a run and holds its scheduler role.

Bootstraps the DHT, publishes the signed run spec (with its gossip address, where peers join the control
plane), keeps a heartbeat record of its own (peers elect a successor when it stops), and prints the address peers
join with. Its `SchedulerRole` plans the run once `min_peers` peers have announced themselves, re-plans on churn,
commits the iterations and writes the metrics. The run ends at its last iteration, or when the coordinator is
stopped: either way the peers are told, and leave.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from peers.data import Corpus
from scheduler.schedule import Schedule
from swarm.constants import LOOPBACK_HOST, RUN_SPEC_TTL
from swarm.control.membership import TOKEN_BYTES, check_token, token_proof
from swarm.control.messages import publish
from swarm.control.node import Node
from swarm.control.record_writers import RecordWriters
from swarm.coordinator.dial_back import DialBack
from swarm.coordinator.run_members import RunMembers
from swarm.coordinator.scheduler_role import SchedulerRole
from swarm.net.identity import ensure_identity
from swarm.run_config import RunConfig
from swarm.wire import PeerRecord, PeerState

logger = logging.getLogger(__name__)


class RunDirError(ValueError):
    """The coordinator's run directory holds something it cannot use (and must not silently replace)."""


@dataclass(frozen=True)
class CoordinatorOptions:
    config: RunConfig
    identity_path: str
    host: str = LOOPBACK_HOST
    port: int = 0
    run_dir: str | None = None
    """Where the address file (coordinator.json), the schedules and the metrics go."""
    metrics_path: str | None = None
    """One JSON line per iteration (default: run_dir/metrics.jsonl)."""
    admission: str = "token"
    """Whom the run admits (`swarm.control.membership.AdmissionPolicy`): "token" holders, the "allow"ed peer ids,
    or anyone ("open")."""
    allowed: tuple[str, ...] = ()
    relay: bool = False
    """Relay for peers that cannot be dialled: hold their circuit-relay reservations (which keep their connections
    up) and forward members' streams to them (`swarm.net.forwarding`)."""
    first_schedule: Schedule | None = None
    """A saved plan of these peers (an earlier run's `schedule-N.json`) to start from instead of planning: a run
    restarted on the same machines keeps its placement, and two runs compared on one plan differ only in what
    happens during them. Used once every peer it places is live; a fresh plan if they are not within
    `LINK_WAIT_SECONDS`, or if a peer pins another stage."""


class Coordinator:
    """One coordinator process. `run(stop)` blocks until the run's last iteration is committed or `stop` is set."""

    def __init__(self, options: CoordinatorOptions) -> None:
        self.options = options
        self.config = options.config
        self.peer_id = ensure_identity(options.identity_path)
        self.run_dir = Path(options.run_dir) if options.run_dir else None
        self.role: SchedulerRole | None = None
        self.dial_back: DialBack | None = None
        self.node = Node(options.identity_path, self.config.run_id, host=options.host, port=options.port,
                         on_message=self._on_message)

    def run(self, stop: threading.Event) -> None:
        try:
            self._start()
            last_spec = time.monotonic()
            while not stop.is_set() and not self.role.done:
                if time.monotonic() - last_spec > RUN_SPEC_TTL / 3:
                    try:
                        self.node.records.publish_run_spec(self.spec)
                        last_spec = time.monotonic()
                    except Exception as e:  # the DHT timed out: the stored spec lives on; next tick tries again
                        logger.warning("could not refresh the run spec: %s: %s", type(e).__name__, e)
                self.role.tick()
            self.role.finish(stop)
        finally:
            if self.role is not None:
                self.role.close()
            if self.dial_back is not None:
                self.dial_back.stop()
            self.node.stop()

    def _on_message(self, msg) -> None:
        if self.role is not None:  # nobody knows the run before the role exists
            self.role.deliver(msg)

    def _start(self) -> None:
        o, node = self.options, self.node
        if self.run_dir:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.join_token = self._join_token()
        run_id = self.config.run_id  # the DHT keeps the records of those the run admits only, from the start
        records = node.start_dht(reachability="public" if o.relay else None,
                                 writers=RecordWriters(run_id, self.peer_id, o.admission, frozenset(o.allowed),
                                                       self.join_token),
                                 proof=token_proof(self.join_token, self.peer_id, run_id) if self.join_token else b"")
        members = RunMembers(records.fetch_peers, self.config.run_id, {self.peer_id})
        if o.relay:
            node.start_forwarder(members)
        corpus = Corpus.build(self.config.data)  # trains (and caches) the run's tokenizer once
        info = node.start_gossip()
        self.spec = dataclasses.replace(
            self.config.to_spec(coordinator=self.peer_id, vocab_size=corpus.vocab_size,
                                control_addrs=tuple(info.maddrs)), admission=o.admission, allowed=o.allowed)
        if not records.publish_run_spec(self.spec):
            raise RuntimeError("could not store the run spec in the DHT")
        metrics = o.metrics_path or (str(self.run_dir / "metrics.jsonl") if self.run_dir else None)
        self.role = SchedulerRole(self.config, self.spec, self.peer_id, records, node.gossip,
                                  run_dir=self.run_dir, metrics_path=metrics, first_schedule=o.first_schedule,
                                  token=self.join_token)
        # a heartbeat of its own, so that peers notice when the coordinator is gone and elect a successor
        node.start_heartbeat(lambda: PeerRecord(peer_id=self.peer_id, stage=-1, seconds_per_layer=1.0, memory_slots=1,
                                                state=PeerState.ONLINE, control_addrs=tuple(info.maddrs)),
                             period=self.config.heartbeat)
        self.initial_peers = node.visible_maddrs()
        self.dial_back = DialBack(records.fetch_peers, members, lambda m: publish(node.gossip, self.config.run_id, m),
                                  relay=o.relay, exempt={self.peer_id}).start()
        if self.run_dir:
            write_private(self.run_dir / "coordinator.json", json.dumps(
                {"run_id": self.config.run_id, "initial_peers": self.initial_peers, "coordinator": self.peer_id,
                 "join_token": self.join_token}))
        if o.admission == "open":
            logger.warning("run %s is open: anyone who reaches it is admitted and placed", self.config.run_id)
        token = f" --token {self.join_token}" if self.join_token else ""
        logger.info("run %s started; peers join with: skippipe-peer join --run %s --initial-peers %s%s",
                    self.config.run_id, self.config.run_id, self.initial_peers[0], token)

    def _join_token(self) -> str | None:
        """The run's join token: the one this run directory already has (peers holding it stay admitted across a
        restart of the coordinator: with another token, the DHT would refuse their records), else a new random one;
        none for an allow-listed or open run. Raises `RunDirError` if the run directory's token cannot be read."""
        if self.options.admission != "token":
            return None
        saved = self.run_dir / "coordinator.json" if self.run_dir else None
        if saved is not None and saved.is_file():
            try:
                data = json.loads(saved.read_text())
                token = data.get("join_token") if isinstance(data, dict) else None
                if token is None and isinstance(data, dict):  # the run was not a token run before
                    return secrets.token_urlsafe(TOKEN_BYTES)
                if not isinstance(token, str):
                    raise ValueError("its join_token is not a string")
                return check_token(token)
            except (OSError, ValueError) as e:
                raise RunDirError(f"{saved}: cannot read the run's join token ({e}); its peers hold that token, and "
                                  f"with a new one the DHT would refuse their records: restore the file, or remove "
                                  f"it to start the run afresh with a new token") from None
        return secrets.token_urlsafe(TOKEN_BYTES)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (it holds the join token), replacing it atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
