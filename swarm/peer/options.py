"""`PeerOptions`: how a volunteer's peer joins a run (the run itself is described by the coordinator's run spec)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from swarm.constants import LOOPBACK_HOST, MAX_ID_CHARS, PROBE_SAMPLE_SIZE
from swarm.net.identity import looks_like_peer_id


def trusted_coordinator(initial_peers: tuple[str, ...], coordinator: str | None = None) -> str:
    """The peer id whose run spec (and so schedules, commits, hyperparameters) a joiner trusts: `coordinator` if
    given, else the ``/p2p/`` peer id of the first bootstrap address. Raises ValueError if neither names one.

    A joiner never takes "the newest run spec in the DHT": anyone can publish one.
    """
    if coordinator is None:
        for address in initial_peers:
            parts = address.split("/")
            if "p2p" in parts[:-1]:
                coordinator = parts[parts.index("p2p") + 1]
                break
        else:
            raise ValueError("no --initial-peers address names a peer id (.../p2p/Qm...): pass --coordinator ID, "
                             "the coordinator's peer id, so that this peer knows whose run spec to trust")
    if not looks_like_peer_id(coordinator):
        raise ValueError(f"{coordinator[:MAX_ID_CHARS]!r} is not a peer id (base58, like Qm...)")
    return coordinator


@dataclass(frozen=True)
class PeerOptions:
    """How this peer joins (the run itself is described by the coordinator's run spec)."""

    initial_peers: tuple[str, ...]
    """Multiaddrs of any peers (or the coordinator) already in the run."""
    identity_path: str
    """Key file; created on first run. One key, one peer id, in the DHT, the transport and gossip."""
    token: str | None = None
    """The run's join token (the scheduler admits holders of it); None for an allow-listed or open run."""
    coordinator: str | None = None
    """Peer id of the run's coordinator, the only signer of a run spec this peer trusts (None: the peer id of the
    first `initial_peers` address, see `trusted_coordinator`)."""
    run_id: str = "skippipe"
    host: str = LOOPBACK_HOST
    port: int = 0
    announce_addrs: tuple[str, ...] = ()
    """Multiaddrs to announce instead of the bound ones (a forwarded port, a public address; `--announce-addr`)."""
    reachability: str = "auto"
    """"public", "relayed" (behind NAT: reached through a relay), or "auto" (`swarm.net.reachability.decide`)."""
    stage: int | None = None
    """Serve this stage (None: the planner decides)."""
    data_paths: tuple[str, ...] = ()
    """Local training files: this peer becomes a data holder with its own data."""
    device: str = "cpu"
    precision: str = "auto"
    """Compute precision: auto (the run's `train.precision`), fp32, bf16, or fp16 (in an fp16 run only)."""
    iteration_deadline: float = 300.0
    """Most seconds this peer waits for its part of one iteration; the deadline it uses is a multiple of how
    long iterations take (see `IterationClock.iteration_deadline`), capped by this."""
    averaging_deadline: float = 60.0
    join_timeout: float = 120.0
    """Seconds to wait for the run spec and for a schedule that places this peer."""
    state_timeout: float = 120.0
    """Seconds a joiner waits for its stage's state from the stage's veterans before it gives the placement up
    (and is placed afresh, elsewhere)."""
    log_gossip: str | None = None
    ledger_path: str | None = None
    """Where a data holder appends its data ledger (JSON lines)."""
    checkpoint_dir: str | None = None
    """Where this peer writes its own checkpoint every `checkpoint_every` iterations of the run."""
    init_from: str | None = None
    """This peer's copy of the checkpoint a run starts from (run.init_from): its stage's weights at iteration 0."""
    metrics_path: str | None = None
    """Where this peer writes the run's metrics if it becomes the scheduler (the coordinator died)."""
    probe_sample: int = PROBE_SAMPLE_SIZE
    """Peers whose links one probing round measures (unmeasured ones first, then the stalest)."""
    log_param_digest: bool = False
    """Log a digest of the stage's parameters after every step (to check that a stage group agrees)."""
    trace_path: str | None = None
    """Where this peer appends its timeline (compute and send spans, JSON lines) for a Chrome trace."""
    emulate_seconds_per_layer: float | None = None
    """Compute emulation: announce this speed instead of the measured one and pad every operation to it."""
    emulate_drift: float = 1.0
    """Compute emulation: pad every operation to this many times the speed announced (a machine whose owner started a
    job after it measured itself; `emulate_seconds_per_layer` is still what it announces)."""
    fault: str | None = None
    """Misbehave on purpose (`swarm.peer.faults`): for testing a swarm's defences only."""
    link_latency: Mapping[str, float] | None = None
    """Link emulation: one-way seconds the transport waits before each message to that peer (a `LatencyFile` reads
    its file again when it changes)."""
    threads: int | None = None
    """Torch threads (None: this machine's cores shared among the peers registered in `host_registry`)."""
    host_registry: str | None = None
    """Directory of the host's live peers (`swarm.peer.host_share`); None: count this peer as alone."""

    def link_delay(self) -> Callable[[str], float] | None:
        """The transport's link emulation (`Transport(link_delay=...)`) from `link_latency`: a peer's one-way seconds,
        0 for one it does not list; None without emulation. Looked up per message, so a `LatencyFile` rewritten
        mid-run slows or speeds its links from the next one."""
        table = self.link_latency
        return None if table is None else (lambda peer: table.get(peer, 0.0))
