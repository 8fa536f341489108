"""What the emulated networks share: commands run as root, a bridge in the root namespace, naming, tear-down, and
the latency files the peers' transport reads (this kernel has no netem: latency is added by the transport).

`swarm.local.emulated_network.EmulatedNetwork` (one bridge, shaped links) and `swarm.local.nat_network.NatNetwork`
(a hub with home networks behind NAT routers) build on these.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from swarm.local.interrupts import deferred_interrupts

MAX_EMULATED_LATENCY = 10.0
"""Largest one-way latency a latency file may give a link (seconds)."""


def missing_tools(what: str, tools: Iterable[tuple[str, str]]) -> str | None:
    """Why this machine cannot build `what` (None when it can): not root, or a (tool, package) missing."""
    if os.geteuid() != 0:
        return f"{what} needs root (network namespaces)"
    for tool, package in tools:
        if shutil.which(tool) is None:
            return f"{what} needs {package}'s `{tool}` (as root: apt-get install {package}, or make system-packages)"
    return None


def run(*cmd: str) -> None:
    """Run a set-up command; raise RuntimeError with its stderr if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")


def checked_tag(tag: str | None) -> str:
    """1-8 ASCII letters or digits naming a network's interfaces (default: from the pid)."""
    tag = tag or str(os.getpid() % 100_000)
    if not (tag.isascii() and tag.isalnum() and len(tag) <= 8):
        raise ValueError(f"tag must be 1-8 ASCII letters or digits (it names interfaces), got {tag!r}")
    return tag


def subnet(kind: str, tag: str, first: int) -> str:
    """A /24 prefix for network `kind` tagged `tag` (10.first+k.x): two networks of one process do not clash."""
    digest = zlib.crc32(kind.encode() + tag.encode())
    return f"10.{first + digest % 50}.{(digest // 50) % 250}"


def make_bridge(bridge: str, address: str) -> None:
    """A bridge in the root namespace with `address`/24 (the hub, where the coordinator listens)."""
    run("ip", "link", "add", bridge, "type", "bridge")
    run("ip", "addr", "add", f"{address}/24", "dev", bridge)
    run("ip", "link", "set", bridge, "up")


def add_namespace(name: str) -> None:
    run("ip", "netns", "add", name)
    run("ip", "-n", name, "link", "set", "lo", "up")


def remove(namespaces: Sequence[str], links: Iterable[str], bridge: str | None) -> None:
    """Delete `namespaces` (with their interfaces, rules and qdiscs), then `links` and `bridge`; a Ctrl+C waits."""
    with deferred_interrupts():
        for ns in reversed(namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for link in links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        if bridge is not None:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def checked_latency(latency: np.ndarray, n: int) -> np.ndarray:
    """`latency` as an [n, n] array of one-way seconds in [0, MAX_EMULATED_LATENCY] off the diagonal."""
    latency = np.asarray(latency, dtype=float)
    off = ~np.eye(n, dtype=bool)
    if latency.shape != (n, n) or not np.all(np.isfinite(latency[off])) or np.any(latency[off] < 0) \
            or np.any(latency[off] > MAX_EMULATED_LATENCY):
        raise ValueError(f"latencies must be an [n, n] array with entries in [0, {MAX_EMULATED_LATENCY}] s")
    return latency


def write_latency_file(latency: np.ndarray, i: int, peer_ids: Sequence[str], path: str | Path) -> Path:
    """Host `i`'s one-way latency to each other host, keyed by the peer id that runs there
    (`swarm.local.emulated_network.read_latency_file` reads it). The file is replaced whole: a peer reading it
    again mid-run (`LatencyFile`) never sees it half written."""
    if len(peer_ids) != latency.shape[0]:
        raise ValueError(f"need one peer id per host ({latency.shape[0]}), got {len(peer_ids)}")
    table = {p: float(latency[i, j]) for j, p in enumerate(peer_ids) if j != i}
    path = Path(path)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps({"latency_s": table}, indent=1))
    os.replace(part, path)
    return path
