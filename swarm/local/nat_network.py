"""`NatNetwork`: public hosts and home networks behind NAT routers, on one machine, for tests and benchmarks.

The shape of a volunteer swarm: a hub bridge (the public internet) in the root namespace, where the coordinator
listens on the bridge's own address (`gateway`); public hosts, each a network namespace on the hub; and home
networks, each a router namespace with one leg on the hub (its public address) and one on a home bridge, behind
which home hosts sit with the router as their default gateway. A router masquerades what its homes send out and
drops every connection the hub opens towards them (only replies to connections opened from inside come back), as a
home NAT router without port forwarding does. Home A cannot reach home B directly; both reach the public side.

Hosts are numbered 0..n-1 as in `EmulatedNetwork` (`host(i)`, `exec_prefix(i)`, `gateway`), so `LocalSwarm` runs
peer i in host i of either. Latency is the transport's (`write_latency_file`, same format); `uplink` optionally
shapes every host's outgoing link (HTB on its interface) so that relayed and direct paths can be compared.

Needs root, iproute2 and iptables (in the namespaces only; nothing in the root namespace's tables is touched).
`stop()` (or leaving the `with` block) deletes every namespace and interface it made, also after a failed start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from swarm.local.namespaces import (
    add_namespace,
    checked_latency,
    checked_tag,
    make_bridge,
    missing_tools,
    remove,
    run,
    subnet,
    write_latency_file,
)

logger = logging.getLogger(__name__)

MAX_HOMES = 50


def unavailable_reason() -> str | None:
    """Why this machine cannot build NAT networks (None when it can)."""
    return missing_tools("NAT emulation", (("ip", "iproute2"), ("tc", "iproute2"), ("iptables", "iptables")))


class NatNetwork:
    """Hosts 0..n-1: `homes[i]` is None for a public host on the hub, or k for a host behind home router k.

    :param homes: one entry per host; home numbers need not be contiguous (each distinct k is one router)
    :param latency: [n, n] one-way seconds the transport adds per message (`write_latency_file`); None: zero
    :param uplink: bytes/s each host may send (its access link), None: unshaped
    :param tag: 1-8 ASCII letters or digits naming the interfaces (default: from the pid)
    """

    def __init__(self, homes: Sequence[int | None], *, latency: np.ndarray | None = None,
                 uplink: float | None = None, tag: str | None = None) -> None:
        n = len(homes)
        if not 1 <= n <= 200:
            raise ValueError(f"a NAT network has 1-200 hosts, got {n}")
        if any(h is not None and (type(h) is not int or not 0 <= h < MAX_HOMES) for h in homes):
            raise ValueError(f"homes must be None (public) or a home number in 0..{MAX_HOMES - 1}, got {list(homes)}")
        self.homes = list(homes)
        self.num_hosts = n
        self.latency = np.zeros((n, n)) if latency is None else checked_latency(latency, n)
        if uplink is not None and not 1000 <= uplink < 1e12:
            raise ValueError(f"uplink must be at least 1000 bytes/s, got {uplink}")
        self.uplink = uplink
        self.tag = checked_tag(tag)
        self._subnet = subnet("nat", self.tag, 150)
        self.bridge = f"skn{self.tag}"
        self._namespaces: list[str] = []
        self._links: list[str] = []
        self._bridge_made = False

    # ---- addresses -------------------------------------------------------------------------------
    @property
    def routers(self) -> list[int]:
        """The home numbers, one router each, in order."""
        return sorted({h for h in self.homes if h is not None})

    def is_public(self, i: int) -> bool:
        return self.homes[i] is None

    def namespace(self, i: int) -> str:
        return f"skn{self.tag}-{i}"

    def router_namespace(self, home: int) -> str:
        return f"skn{self.tag}-r{home}"

    def host(self, i: int) -> str:
        """The IPv4 address host `i` binds (a home host's is private: only its home network reaches it)."""
        home = self.homes[i]
        return f"{self._subnet}.{i + 1}" if home is None else f"192.168.{home + 1}.{i + 10}"

    def router_address(self, home: int) -> str:
        """Router `home`'s public address on the hub: what the public side sees a home host's traffic come from."""
        return f"{self._subnet}.{201 + home}"

    @property
    def gateway(self) -> str:
        """The hub bridge's address, in this (the root) namespace: where the coordinator listens (public)."""
        return f"{self._subnet}.254"

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command to run it in host `i`."""
        return ["ip", "netns", "exec", self.namespace(i)]

    # ---- set-up and tear-down --------------------------------------------------------------------
    def start(self) -> NatNetwork:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        try:
            self._bridge_made = True
            make_bridge(self.bridge, self.gateway)
            for home in self.routers:
                self._add_router(home)
            for i in range(self.num_hosts):
                self._add_host(i)
        except BaseException:
            self.stop()
            raise
        logger.info("NAT network %s: %d hosts, %d behind %d routers", self.bridge, self.num_hosts,
                    sum(h is not None for h in self.homes), len(self.routers))
        return self

    def _netns(self, name: str) -> None:
        self._namespaces.append(name)
        add_namespace(name)

    def _add_router(self, home: int) -> None:
        ns, wan = self.router_namespace(home), f"skn{self.tag}w{home}"
        self._netns(ns)
        run("ip", "link", "add", wan, "type", "veth", "peer", "name", "wan", "netns", ns)
        self._links.append(wan)
        run("ip", "link", "set", wan, "master", self.bridge, "up")
        run("ip", "-n", ns, "addr", "add", f"{self.router_address(home)}/24", "dev", "wan")
        run("ip", "-n", ns, "link", "set", "wan", "up")
        run("ip", "-n", ns, "link", "add", "lan", "type", "bridge")
        run("ip", "-n", ns, "addr", "add", f"192.168.{home + 1}.1/24", "dev", "lan")
        run("ip", "-n", ns, "link", "set", "lan", "up")
        ipt = ["ip", "netns", "exec", ns, "iptables"]
        run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        run(*ipt, "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE")
        run(*ipt, "-A", "FORWARD", "-i", "wan", "-m", "state", "--state", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        run(*ipt, "-A", "FORWARD", "-i", "wan", "-j", "DROP")
        run(*ipt, "-A", "INPUT", "-i", "wan", "-m", "state", "--state", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        run(*ipt, "-A", "INPUT", "-i", "wan", "-j", "DROP")

    def _add_host(self, i: int) -> None:
        ns, home = self.namespace(i), self.homes[i]
        self._netns(ns)
        if home is None:
            veth = f"skn{self.tag}v{i}"
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._links.append(veth)
            run("ip", "link", "set", veth, "master", self.bridge, "up")
            run("ip", "-n", ns, "addr", "add", f"{self.host(i)}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")  # no default route: the hub is the whole internet
        else:
            router, leg = self.router_namespace(home), f"h{i}"
            run("ip", "-n", router, "link", "add", leg, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "-n", router, "link", "set", leg, "master", "lan", "up")
            run("ip", "-n", ns, "addr", "add", f"{self.host(i)}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "route", "add", "default", "via", f"192.168.{home + 1}.1")
        if self.uplink is not None:
            rate = f"{max(8000, math.floor(self.uplink * 8))}bit"
            run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb",
                 "default", "1")
            run("ip", "netns", "exec", ns, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1",
                 "htb", "rate", rate, "ceil", rate, "quantum", "1514")

    def stop(self) -> None:
        """Delete every namespace (with its interfaces, rules and qdiscs) and the hub bridge; a Ctrl+C waits."""
        remove(self._namespaces, self._links, self.bridge if self._bridge_made else None)
        self._namespaces, self._links, self._bridge_made = [], [], False

    def __enter__(self) -> NatNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- latency for the transport ---------------------------------------------------------------
    def write_latency_file(self, i: int, peer_ids: Sequence[str], path: str | Path) -> Path:
        """Host `i`'s one-way latency to each other host, keyed by the peer id that runs there
        (`swarm.local.emulated_network.read_latency_file` reads it)."""
        return write_latency_file(self.latency, i, peer_ids, path)
