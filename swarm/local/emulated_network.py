"""`EmulatedNetwork`: a WAN on one machine, for benchmarks of a local swarm over a network profile.

Each peer gets a host of its own: a network namespace joined to one bridge by a veth pair. Bandwidth is shaped
in the kernel: on every host's outgoing interface, an HTB class per destination host limits that directed link
to the profile's bandwidth (traffic to the bridge itself, where the coordinator listens, is not shaped), and
`set_bandwidth` reshapes one mid-run. This
kernel has no `netem`, so latency is added by the peers' transport instead: each peer reads the one-way latency
of its links from a file written here (`--emulate-latency`); the transport waits that long before each message
(see `Transport(link_delay=...)`). Both only exist while an emulation runs; nothing is shaped otherwise.

Needs root and iproute2 (`ip netns`, `tc`). `stop()` (or leaving the `with` block) deletes every namespace,
interface and qdisc it made; processes started in a host must be stopped first.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from swarm.constants import MAX_ID_CHARS, MAX_PEERS
from swarm.local.namespaces import (
    MAX_EMULATED_LATENCY,
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

UNSHAPED_RATE = "10gbit"
"""Rate of the default class: traffic to the bridge (the coordinator) and anything unlisted."""


def unavailable_reason() -> str | None:
    """Why this machine cannot emulate a network (None when it can)."""
    return missing_tools("network emulation", (("ip", "iproute2"), ("tc", "iproute2")))


class EmulatedNetwork:
    """Hosts 0..n-1 in network namespaces on one bridge, links shaped to `bandwidth`, latencies for the transport.

    :param latency: [n, n] one-way seconds of each directed link
    :param bandwidth: [n, n] bytes/s of each directed link
    """

    def __init__(self, latency: np.ndarray, bandwidth: np.ndarray, *, tag: str | None = None) -> None:
        # bandwidth is copied: `set_bandwidth` changes it
        latency, bandwidth = np.asarray(latency, dtype=float), np.array(bandwidth, dtype=float)
        n = latency.shape[0]
        if not 1 <= n <= 250 or latency.shape != (n, n) or bandwidth.shape != (n, n):
            raise ValueError(f"latency and bandwidth must be [n, n] with 1 <= n <= 250, got {latency.shape} and "
                             f"{bandwidth.shape}")
        latency = checked_latency(latency, n)
        off = ~np.eye(n, dtype=bool)
        if not np.all(np.isfinite(bandwidth[off])) or np.any(bandwidth[off] < 1000):
            raise ValueError("bandwidths must be finite and at least 1000 bytes/s")
        self.latency, self.bandwidth, self.num_hosts = latency, bandwidth, n
        self.tag = checked_tag(tag)
        self._subnet = subnet("", self.tag, 200)
        self.bridge = f"skpbr{self.tag}"
        self._namespaces: list[str] = []
        self._bridge_made = False

    # ---- addresses -------------------------------------------------------------------------------
    def namespace(self, i: int) -> str:
        return f"skp{self.tag}-{i}"

    def _veth(self, i: int) -> str:
        return f"skp{self.tag}v{i}"

    def host(self, i: int) -> str:
        """The IPv4 address of host `i` (listen there)."""
        return f"{self._subnet}.{i + 1}"

    @property
    def gateway(self) -> str:
        """The bridge's address, in this (the root) namespace: where the coordinator listens."""
        return f"{self._subnet}.254"

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command to run it in host `i`."""
        return ["ip", "netns", "exec", self.namespace(i)]

    # ---- set-up and tear-down --------------------------------------------------------------------
    def start(self) -> EmulatedNetwork:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        try:
            self._bridge_made = True
            make_bridge(self.bridge, self.gateway)
            for i in range(self.num_hosts):
                self._add_host(i)
        except BaseException:
            self.stop()
            raise
        logger.info("emulated network %s: %d hosts on %s.0/24", self.bridge, self.num_hosts, self._subnet)
        return self

    def _add_host(self, i: int) -> None:
        ns, veth = self.namespace(i), self._veth(i)
        self._namespaces.append(ns)
        add_namespace(ns)
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "link", "set", veth, "master", self.bridge, "up")
        run("ip", "-n", ns, "addr", "add", f"{self.host(i)}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        tc = ["ip", "netns", "exec", ns, "tc"]
        run(*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1")
        run(*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate", UNSHAPED_RATE,
             "quantum", "60000")
        for j in range(self.num_hosts):
            if j == i:
                continue
            self._shape(i, j, "add")
            run(*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                 "match", "ip", "dst", f"{self.host(j)}/32", "flowid", f"1:{j + 10:x}")

    def _shape(self, i: int, j: int, verb: str) -> None:
        """`tc class add` or `change` of the directed link i -> j's class to `bandwidth[i, j]`."""
        rate = f"{max(8000, math.floor(self.bandwidth[i, j] * 8))}bit"
        run(*self.exec_prefix(i), "tc", "class", verb, "dev", "eth0", "parent", "1:", "classid", f"1:{j + 10:x}",
            "htb", "rate", rate, "ceil", rate, "quantum", "1514")

    def set_bandwidth(self, src: int, dst: int, bytes_per_second: float) -> None:
        """Shape the directed link src -> dst to `bytes_per_second` from now on, connections open or not (a route
        congested mid-run, a volunteer's upload taken by another job). The peers are not told: they find out from
        their own sends, as on a real network."""
        if not (0 <= src < self.num_hosts and 0 <= dst < self.num_hosts and src != dst):
            raise ValueError(f"no link {src} -> {dst} among {self.num_hosts} hosts")
        if not math.isfinite(bytes_per_second) or bytes_per_second < 1000:
            raise ValueError(f"bandwidth must be finite and at least 1000 bytes/s, got {bytes_per_second}")
        if self.namespace(src) not in self._namespaces:
            raise RuntimeError("the network is not started")
        self.bandwidth[src, dst] = bytes_per_second
        self._shape(src, dst, "change")

    def stop(self) -> None:
        """Delete every namespace (with its interfaces and qdiscs) and the bridge (a Ctrl+C waits for it)."""
        remove(self._namespaces, [self._veth(i) for i in range(self.num_hosts)],
               self.bridge if self._bridge_made else None)
        self._namespaces, self._bridge_made = [], False

    def __enter__(self) -> EmulatedNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- latency for the transport ---------------------------------------------------------------
    def write_latency_file(self, i: int, peer_ids: Sequence[str], path: str | Path) -> Path:
        """Host `i`'s one-way latency to each other host, keyed by the peer id that runs there."""
        return write_latency_file(self.latency, i, peer_ids, path)


def read_latency_file(path: str | Path) -> dict[str, float]:
    """Peer id -> one-way seconds, from a file of `write_latency_file` (untrusted: checked entry by entry)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read latency file {path}: {e}") from None
    table = raw.get("latency_s") if isinstance(raw, dict) else None
    if not isinstance(table, dict) or len(table) > MAX_PEERS:
        raise ValueError(f"latency file {path} must hold {{\"latency_s\": {{peer id: seconds}}}} with at most "
                         f"{MAX_PEERS} entries")
    out = {}
    for peer, seconds in table.items():
        if not isinstance(peer, str) or not 0 < len(peer) <= MAX_ID_CHARS:
            raise ValueError(f"latency file {path}: bad peer id {peer!r}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
                not 0 <= seconds <= MAX_EMULATED_LATENCY:
            raise ValueError(f"latency file {path}: latency to {peer} must be 0-{MAX_EMULATED_LATENCY} s, got "
                             f"{seconds!r}")
        out[peer] = float(seconds)
    return out


class LatencyFile(Mapping[str, float]):
    """The one-way latencies of a file of `write_latency_file`, read again when its content changes (looked at once
    a second at most: a few hundred bytes), so that a benchmark or test can slow a link mid-run by rewriting it. A
    rewrite that does not read is logged and the table in force kept.

    :raises ValueError: the file does not read at first (`read_latency_file`)
    """

    def __init__(self, path: str | Path, *, look_every: float = 1.0) -> None:
        self.path, self.look_every = Path(path), look_every
        self._table = read_latency_file(self.path)
        self._content = self._read()
        self._looked = time.monotonic()

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def _current(self) -> dict[str, float]:
        now = time.monotonic()
        if now - self._looked >= self.look_every:
            self._looked, content = now, self._read()
            if content is not None and content != self._content:
                self._content = content
                try:
                    self._table = read_latency_file(self.path)
                    logger.info("link latencies read again from %s", self.path)
                except ValueError as e:
                    logger.warning("%s; the latencies in force are kept", e)
        return self._table

    def __getitem__(self, peer: str) -> float:
        return self._current()[peer]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())
