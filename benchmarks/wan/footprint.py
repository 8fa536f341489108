"""Per-peer memory footprint of a local swarm: proportional set size (PSS) of every process of each peer's tree.

A peer is several processes: the peer itself (torch, the stage worker, the transport), its gossip sidecar, the
DHT process hivemind forks, the p2p daemons (p2pd) and small helpers (the reaper, multiprocessing's resource
tracker). PSS counts each shared page once across the processes that map it (shared libraries, torch), so the
sum over a tree is what that peer adds to the machine. Read from /proc/PID/smaps_rollup through psutil.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import psutil

MIB = 1024 * 1024
KINDS = ("peer", "dht", "gossip sidecar", "p2pd", "helpers")


def kind_of(proc: psutil.Process, root: int) -> str:
    """Which part of a peer's tree `proc` is (the tree's root is the peer process `root`)."""
    cmdline = " ".join(proc.cmdline())
    if "p2pd" in proc.name() or "p2pd" in cmdline.split(" ")[0]:
        return "p2pd"
    if "gossip_sidecar" in cmdline:
        return "gossip sidecar"
    if proc.pid == root:
        return "peer"
    if "swarm.net.reaper" in cmdline or "resource_tracker" in cmdline or "torch_shm_manager" in cmdline:
        return "helpers"
    return "dht"  # hivemind's DHT: a forked child with the peer's own command line


def tree_footprint(pid: int) -> dict[str, int]:
    """PSS bytes by kind of the processes of the tree rooted at `pid` (those that exit meanwhile are skipped)."""
    out: dict[str, int] = defaultdict(int)
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    for proc in procs:
        try:
            out[kind_of(proc, pid)] += proc.memory_full_info().pss
        except psutil.Error:
            continue
    return dict(out)


def swarm_footprint(pids: list[int]) -> dict:
    """Each peer tree's footprint (MiB by kind and total) and, per kind, the median and max over the peers."""
    trees = [tree_footprint(pid) for pid in pids]
    trees = [t for t in trees if t]
    per_kind = {k: [t.get(k, 0) / MIB for t in trees] for k in KINDS}
    totals = [sum(t.values()) / MIB for t in trees]
    return {"peers": len(trees),
            "median_mib": {k: round(statistics.median(v), 1) for k, v in per_kind.items() if v},
            "max_mib": {k: round(max(v), 1) for k, v in per_kind.items() if v},
            "total_median_mib": round(statistics.median(totals), 1) if totals else None,
            "total_max_mib": round(max(totals), 1) if totals else None,
            "swarm_total_mib": round(sum(totals), 1),
            "processes_per_peer": statistics.median([_count(p) for p in pids] or [0]),
            "example_tree": describe_tree(pids[0]) if pids else []}


def describe_tree(pid: int) -> list[dict]:
    """Each process of the tree rooted at `pid`: its kind, name, the start of its command line, PSS (MiB)."""
    rows = []
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    for proc in procs:
        try:
            rows.append({"kind": kind_of(proc, pid), "name": proc.name(), "cmd": " ".join(proc.cmdline())[:160],
                         "pss_mib": round(proc.memory_full_info().pss / MIB, 1)})
        except psutil.Error:
            continue
    return rows


def _count(pid: int) -> int:
    try:
        return len(psutil.Process(pid).children(recursive=True)) + 1
    except psutil.Error:
        return 0
