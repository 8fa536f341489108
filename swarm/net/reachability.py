"""Reachability: whether a peer can be dialled, and how one that cannot still is.

A peer behind a NAT router or a firewall accepts no inbound connection. It still dials out, so it keeps a
circuit-relay v2 reservation on a publicly reachable peer (the coordinator, or the relays it is given), which keeps
its connection there up, and its record names that relay in a ``/p2p-circuit`` address next to its own. Streams to
it are then carried by the relay itself (`swarm.net.forwarding`): libp2p's relayed connections are *limited*
(the bundled p2pd resets one after 128 KiB each way), enough to coordinate, not to carry activations.

The bundled p2pd (hivemind's go-libp2p-daemon) is driven through `hivemind.P2P.create`, which exposes neither the
relay service's limits nor the daemon's ``-relayDiscovery`` switch; both go through its reachability table
(`P2P.FORCE_REACHABILITY_MAPPING`, extra daemon flags per mode, read in the DHT's forked process), registered here:
- ``RELAY_MODE``: reachable; holds reservations for others, within `RelayLimits`;
- ``RELAYED_MODE``: not reachable; reserves a slot on its static relays at once (with relay discovery on, the
  daemon's autorelay waits minutes for four candidates before it reserves anything).
Hole punching (DCUtR) comes with the daemon's ``-autonat`` (hivemind's default): a relayed connection is upgraded
to a direct one when both sides have a public address the punch can use; there is no separate switch.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hivemind.p2p import P2P

logger = logging.getLogger(__name__)

Reachability = Literal["public", "relayed"]
REACHABILITY_SETTINGS = ("auto", "public", "relayed")
RELAY_MODE = "skippipe-relay"
RELAYED_MODE = "skippipe-relayed"
DIAL_BACK_TIMEOUT = 1.5
"""Seconds a dial-back waits for a TCP connection to an announced address."""
ADVICE = ("forward a TCP port on your router to this machine and pass --announce-addr /ip4/PUBLIC_IP/tcp/PORT "
          "(or run on a machine with a public address)")
"""What a volunteer who cannot be dialled can do about it."""
NOT_OVER_RELAYS = ("hivemind's averager (swarm.averaging = \"hivemind\") opens RPCs of its own, which the relay does "
                   "not carry (swarm.net.forwarding): a relayed peer could not average with its stage; use "
                   "swarm.averaging = \"allgather\" (the default)")
"""Why a run that relays cannot average with hivemind's averager."""


@dataclass(frozen=True)
class RelayLimits:
    """What a relaying peer gives others (p2pd's relay service flags)."""

    max_circuits: int = 64
    """Open relayed connections per peer."""
    max_reservations: int = 128
    """Peers that may hold a reservation."""
    data_limit: int = 1 << 34
    """Bytes relayed per connection and direction before it is reset (and redialled)."""
    time_limit_s: int = 6 * 3600
    """Seconds a relayed connection may last before it is reset (and redialled)."""


def register_daemon_modes(limits: RelayLimits = RelayLimits()) -> None:
    """Teach hivemind's P2P the two reachability modes (idempotent; call before starting a DHT)."""
    P2P.FORCE_REACHABILITY_MAPPING[RELAY_MODE] = {
        "forceReachabilityPublic": 1, "relayService": 1, "relayMaxCircuits": limits.max_circuits,
        "relayMaxReservations": limits.max_reservations, "relayDataLimit": limits.data_limit,
        "relayTimeLimit": f"{limits.time_limit_s}s"}
    P2P.FORCE_REACHABILITY_MAPPING[RELAYED_MODE] = {"forceReachabilityPrivate": 1, "relayDiscovery": 0}


def decide(setting: str, host: str, announce: Sequence[str] = ()) -> Reachability | None:
    """This peer's reachability: `setting` unless "auto", which says public when the peer announces an address
    (`--announce-addr`: a forwarded port) and otherwise None: the daemon runs as before, reached at the addresses
    it binds, neither relaying nor relayed. Relaying is opt-in while it is experimental (docs/nat.md): a private
    address is not proof of being unreachable (a lab network), and a relayed peer sends all its traffic through
    the coordinator."""
    if setting not in REACHABILITY_SETTINGS:
        raise ValueError(f"reachability must be one of {', '.join(REACHABILITY_SETTINGS)}, got {setting!r}")
    if setting != "auto":
        return setting  # type: ignore[return-value]
    return "public" if announce else None


def dht_options(reachability: Reachability | None, *, relays: Sequence[str] = (), announce: Sequence[str] = ()
                ) -> dict[str, Any]:
    """Keyword arguments for `hivemind.DHT` (its `P2P.create`) of a peer with this reachability (None: the
    daemon's defaults, only `announce` applied).

    :param relays: multiaddrs (with /p2p/ID) of the public peers a relayed peer keeps a reservation on
    :param announce: multiaddrs to announce instead of the bound ones (a forwarded port, a public address)
    """
    register_daemon_modes()
    out: dict[str, Any] = {}
    if announce:
        out["announce_maddrs"] = list(announce)
    if reachability is None:
        return out
    if reachability == "public":
        out["force_reachability"] = RELAY_MODE
    else:
        if not relays:
            raise ValueError("a peer that cannot be dialled needs at least one relay (a public peer's multiaddr)")
        out.update(force_reachability=RELAYED_MODE, use_relay=True, use_auto_relay=True, trusted_relays=list(relays))
    return out


def circuit_addresses(relays: Iterable[str], peer_id: str) -> list[str]:
    """The /p2p-circuit addresses of `peer_id` through each relay (each relay's multiaddr ends in /p2p/ID)."""
    return [f"{r}/p2p-circuit/p2p/{peer_id}" for r in relays if "/p2p/" in r and "/p2p-circuit" not in r]


def announce_problem(maddr: str) -> str | None:
    """Why `maddr` cannot be announced (None if it can): a direct /ip4|ip6|dns*/HOST/tcp/PORT with a real port."""
    endpoint = tcp_endpoint(maddr)
    if endpoint is None or len(maddr.split("/")) not in (5, 7):
        return f"{maddr!r:.80} is not a multiaddr like /ip4/203.0.113.7/tcp/31337"
    host, port = endpoint
    if not 0 < port < 65536:
        return f"{maddr!r:.80}: the port must be the one forwarded to this machine (1-65535), not {port}"
    try:
        if ipaddress.ip_address(host).is_unspecified:
            return f"{maddr!r:.80}: an unspecified address reaches nobody; announce the public one"
    except ValueError:
        pass  # a DNS name
    return None


def reachable_addresses(maddrs: Iterable[str], host: str) -> list[str]:
    """What to announce of the daemon's addresses: never an unspecified one, nor a loopback one unless the node
    binds loopback (a local run); a node bound to 0.0.0.0 announces its interfaces' addresses."""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    out = []
    for maddr in maddrs:
        parts = maddr.split("/")
        try:
            address = ipaddress.ip_address(parts[2]) if len(parts) > 2 and parts[1] in ("ip4", "ip6") else None
        except ValueError:
            address = None
        if address is not None and (address.is_unspecified or (address.is_loopback and not local)):
            continue
        out.append(maddr)
    return out


def is_circuit(maddr: str) -> bool:
    return "/p2p-circuit" in maddr


def tcp_endpoint(maddr: str) -> tuple[str, int] | None:
    """(host, port) of a direct /ip4|ip6|dns/../tcp/PORT multiaddr; None for a circuit or another transport."""
    parts = maddr.split("/")
    if is_circuit(maddr) or len(parts) < 5 or parts[1] not in ("ip4", "ip6", "dns", "dns4", "dns6") or \
            parts[3] != "tcp" or not parts[4].isdigit():
        return None
    return parts[2], int(parts[4])


def dial_back(addresses: Iterable[str], timeout: float = DIAL_BACK_TIMEOUT) -> list[str]:
    """The direct addresses among `addresses` that accept a TCP connection from here (a dial-back: run it on a
    public peer, since from inside the same network everything is reachable)."""
    ok = []
    for maddr in addresses:
        endpoint = tcp_endpoint(maddr)
        if endpoint is None:
            continue
        try:
            with socket.create_connection(endpoint, timeout=timeout):
                ok.append(maddr)
        except OSError:
            continue
    return ok
