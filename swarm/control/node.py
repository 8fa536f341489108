"""`Node`: what the coordinator and a peer both are on the network, started and stopped in one place.

A node is a hivemind DHT (a forked process with its p2pd daemon) with the run's signed records over it, a gossip
sidecar subscribed to the run's topics, and a heartbeat record. It acquires its process's `Reaper` before any of
them, so that they die with the process even when it is killed with SIGKILL, and on `stop` takes them down in order:
the heartbeat (its record says it leaves), gossip, then the DHT; the process's last node to stop releases the
reaper, whose last sweep takes anything left.
"""

from __future__ import annotations

import glob
import logging
import time
from collections.abc import Callable, Iterable
from functools import partial

import hivemind
from hivemind.p2p import P2PDaemonError

from swarm.constants import (
    DHT_READY_TIMEOUT,
    DHT_START_ATTEMPTS,
    DHT_START_BACKOFF,
    DHT_TIMEOUT,
    LOOPBACK_HOST,
    MAX_ERROR_CHARS,
    P2PD_STARTUP_TIMEOUT,
    record_lifetime,
)
from swarm.control.gossip import (
    GossipClient,
    GossipInfo,
    GossipMessage,
    membership_topic,
    progress_topic,
    schedule_topic,
)
from swarm.control.messages import ControlMessage, publish
from swarm.control.record_validator import RunRecordValidator, restrict_writers
from swarm.control.record_writers import RecordWriters
from swarm.control.records import Heartbeat, SwarmRecords
from swarm.events import event
from swarm.net.dht_pipe import make_commands_safe
from swarm.net.dht_shutdown import hung_dht_state, stop_dht
from swarm.net.forwarding import Forwarder
from swarm.net.identity import created_here, load_identity
from swarm.net.process_memory import freeze_before_fork, return_large_buffers, share_by_descriptor
from swarm.net.reachability import Reachability, circuit_addresses, dht_options, reachable_addresses
from swarm.net.reaper import Reaper, unlink_when_dead
from swarm.wire import PeerRecord

logger = logging.getLogger(__name__)

P2PD_SOCKETS = "/tmp/hivemind-p2pd-*.sock"
"""Where hivemind's p2pd listens for its client (`P2P._UNIX_SOCKET_PREFIX`)."""
FAILED_DAEMON_GRACE = 3.0
"""Seconds a failed try's p2pd may take to exit; a new socket still listened on after it is another node's."""
DHT_CACHING = {"cache_refresh_before_expiry": 0, "cache_nearest": 0}
"""hivemind's DHT caching, off. The run's records are read with `latest=True`, which never answers from a cache,
so the caching only added lookups: each read was followed by a refresh of the same key (at once, when records live
less than the 5 s hivemind refreshes ahead of expiry) and by a store of the value on the nearest node without it."""


class Node:
    """One process's presence in run `run_id`. Each part is started by its own call, once; `stop` stops what was
    started (also after a failed start), and may be called more than once.

    :param identity_path: the key file (one peer id for the DHT, the transport and gossip)
    :param on_message: called from the gossip client's thread with each message of the run's topics
    """

    def __init__(self, identity_path: str, run_id: str, *, host: str = LOOPBACK_HOST, port: int = 0,
                 on_message: Callable[[GossipMessage], None] | None = None) -> None:
        self.identity_path, self.run_id, self.host, self.port = identity_path, run_id, host, port
        self.identity = load_identity(identity_path)
        self.peer_id = self.identity.peer_id
        self._on_message = on_message
        self.reaper: Reaper | None = None
        self.dht: hivemind.DHT | None = None
        self.records: SwarmRecords | None = None
        self.gossip: GossipClient | None = None
        self.gossip_info: GossipInfo | None = None
        self.heartbeat: Heartbeat | None = None
        self.reachability: Reachability | None = None
        self.relays: tuple[str, ...] = ()
        self.forwarder: Forwarder | None = None

    def start_dht(self, initial_peers: Iterable[str] = (), *, client: bool = False,
                  reachability: Reachability | None = None, relays: Iterable[str] = (),
                  announce: Iterable[str] = (), writers: RecordWriters | None = None,
                  proof: bytes = b"", ready_timeout: float = DHT_READY_TIMEOUT) -> SwarmRecords:
        """Join (or, without `initial_peers`, bootstrap) the DHT; returns the run's signed records over it.

        The DHT validates the run's records as it stores and relays them (`RunRecordValidator`), and keeps only
        those of `writers` where they are known (a node that learns them later calls `restrict_writers`); this
        node's records carry `proof`, its proof of the run's join token (b"" where it has none). A `client` node
        (an onlooker) reads and writes through others and stores nothing for them. A "public" node relays for
        others (within `RelayLimits`); a "relayed" one (it cannot be dialled) keeps a reservation on `relays`
        (default: `initial_peers`) and announces its circuit addresses through them (`swarm.net.reachability`);
        None: neither, the daemon's defaults. `announce` replaces the bound addresses in what the node announces.
        A p2p daemon that does not start, or reaches none of `initial_peers`, is started again, up to
        `DHT_START_ATTEMPTS` times (a loaded host, a bootstrap peer not up yet); then P2PDaemonError. So is a DHT
        process not ready within `ready_timeout` seconds (it is killed with its daemon first); then TimeoutError:
        a joiner fails with a reason rather than waiting for ever."""
        initial_peers = list(initial_peers)
        self.reachability, self.relays = reachability, tuple(relays) or tuple(initial_peers)
        options = dht_options(reachability, relays=self.relays, announce=tuple(announce))
        self.reaper = Reaper.acquire()
        share_by_descriptor()  # hivemind's futures share a few bytes: no torch_shm_manager process for them
        return_large_buffers()  # freed messages go back to the system, not to the arenas of the threads that held them
        for attempt in range(1, DHT_START_ATTEMPTS + 1):
            freeze_before_fork()  # hivemind forks the DHT process next: the two share the objects alive now
            sockets = set(glob.glob(P2PD_SOCKETS))
            began = time.monotonic()
            dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=[f"/ip4/{self.host}/tcp/{self.port}"],
                               identity_path=self.identity_path, start=False, client_mode=client,
                               record_validators=[RunRecordValidator(self.run_id, writers)],
                               check_if_identity_free=not created_here(self.identity_path),
                               startup_timeout=P2PD_STARTUP_TIMEOUT, **DHT_CACHING, **options)
            try:
                dht.run_in_background(await_ready=True, timeout=ready_timeout)
                self.dht = dht
                logger.info("DHT up in %.1f s (try %d)", time.monotonic() - began, attempt)
                break
            except (P2PDaemonError, TimeoutError) as e:  # its p2pd may still be exiting, its socket stays
                error: Exception = e
                if isinstance(e, TimeoutError) and time.monotonic() - began >= ready_timeout:
                    # its process is alive and hung (a failed start ends it, whatever it raised)
                    error = TimeoutError(f"the DHT process was not ready within {ready_timeout:.0f} s "
                                         f"({hung_dht_state(dht)})")
                    stop_dht(dht)
                left = set(glob.glob(P2PD_SOCKETS)) - sockets
                if attempt == DHT_START_ATTEMPTS:
                    unlink_when_dead(left, FAILED_DAEMON_GRACE)
                    if error is e:
                        raise
                    raise error from e
                wait = DHT_START_BACKOFF * attempt
                logger.warning("the DHT did not start (try %d of %d): %s; trying again in %.0f s", attempt,
                               DHT_START_ATTEMPTS, str(error)[:MAX_ERROR_CHARS], wait,
                               extra=event("dht_start_failed", attempt=attempt, error=str(error)[:MAX_ERROR_CHARS]))
                began = time.monotonic()
                unlink_when_dead(left, min(wait, FAILED_DAEMON_GRACE))
                time.sleep(max(0.0, wait - (time.monotonic() - began)))
        self.reaper.watch()  # the DHT process and its p2pd are on the reaper's list from here
        make_commands_safe(self.dht)  # a schedule of tens of KiB must not kill the DHT process
        self.records = SwarmRecords(self.dht, self.identity, self.run_id, proof=proof)
        return self.records

    def restrict_writers(self, writers: RecordWriters, timeout: float = DHT_TIMEOUT, attempts: int = 3) -> int:
        """From now on the DHT stores and relays only the run's records that `writers` admits, and drops those it
        holds that they do not (what a stranger stored before this node knew the run); how many it dropped. Tries
        `attempts` times (a loaded host's DHT process may answer late; a second try changes nothing the first did),
        then raises what the last one did."""
        if self.dht is None:
            raise RuntimeError("the DHT is not started")
        for attempt in range(1, attempts + 1):
            future = self.dht.run_coroutine(partial(restrict_writers, writers=writers), return_future=True)
            try:
                return future.result(timeout)
            except TimeoutError:
                if attempt == attempts:
                    raise
                logger.info("the DHT did not answer within %.0f s (try %d of %d)", timeout, attempt, attempts)
        raise ValueError(f"attempts must be at least 1, got {attempts}")

    def watch_helpers(self) -> None:
        """The node started something more (a p2p client of its own, say): the reaper looks again at once."""
        if self.reaper is not None:
            self.reaper.watch()

    def start_gossip(self, *, bootstrap: Iterable[str] = (), log_path: str | None = None) -> GossipInfo:
        """Start the gossip sidecar, connected to `bootstrap` and subscribed to the run's topics."""
        self.gossip = GossipClient(on_message=self._on_message)
        self.gossip_info = self.gossip.start(self.identity_path, listen_host=self.host, bootstrap=bootstrap,
                                             log_path=log_path)
        if self.reaper is not None:
            self.reaper.watch()
        for topic in (schedule_topic, membership_topic, progress_topic):
            self.gossip.subscribe(topic(self.run_id))
        return self.gossip_info

    def start_heartbeat(self, make_record: Callable[[], PeerRecord], period: float) -> Heartbeat:
        """Publish `make_record()` now and every `period` seconds; the record lives `record_lifetime(period)`."""
        self.heartbeat = self.records.start_heartbeat(make_record, period=period, ttl=record_lifetime(period))
        return self.heartbeat

    def visible_maddrs(self) -> list[str]:
        """Where others reach this node: what its p2pd announces, and for a relayed node its circuit addresses."""
        direct = reachable_addresses([str(a) for a in self.dht.get_visible_maddrs()], self.host)
        if self.reachability != "relayed":
            return direct
        return direct + circuit_addresses(self.relays, self.peer_id)

    def control_addrs(self) -> tuple[str, ...]:
        """Where others reach this node's gossip sidecar: nowhere for a relayed node (py-libp2p's sidecar dials no
        relay, and a dial to its private address only times out); it keeps the links it opened itself."""
        if self.reachability == "relayed" or self.gossip_info is None:
            return ()
        return tuple(self.gossip_info.maddrs)

    def stop_heartbeat(self) -> None:
        """Stop beating; the last record says this node leaves (the DHT may already be unreachable)."""
        if self.heartbeat is not None:
            try:
                self.heartbeat.stop(leave=True)
            except Exception as e:  # the DHT may already be unreachable
                logger.warning("could not announce leaving: %s", e)
            self.heartbeat = None

    def leave(self, notice: ControlMessage) -> None:
        """Leave the run's control plane: stop beating (the last record says this node leaves), gossip `notice`
        (within 2 s; a node leaving does not wait on a dead mesh), then stop the sidecar."""
        self.stop_heartbeat()
        if self.gossip is not None:
            try:
                publish(self.gossip, self.run_id, notice, timeout=2)
            except Exception as e:
                logger.debug("leave notice not sent: %s", e)
            self.stop_gossip()

    def stop_gossip(self) -> None:
        if self.gossip is not None:
            self.gossip.close()
            self.gossip = None

    def start_forwarder(self, admitted: Callable[[str], bool]) -> Forwarder:
        """Relay for members that cannot be dialled (`swarm.net.forwarding`): a public node's part."""
        self.forwarder = Forwarder(self.dht, admitted)
        return self.forwarder

    def stop(self) -> None:
        """Stop the heartbeat, gossip, the forwarder, the DHT and its p2pd, then the reaper (which sweeps anything
        left)."""
        self.stop_heartbeat()
        self.stop_gossip()
        if self.forwarder is not None:
            self.forwarder.shutdown()
            self.forwarder = None
        if self.dht is not None:
            stop_dht(self.dht)
            self.dht = None
        if self.reaper is not None:
            self.reaper.release()  # the process's last node stops it: it sweeps whatever is left
            self.reaper = None
