"""Network profiles: presets from measured cloud links, a seeded random heterogeneous swarm, and files.

`geo-distributed` puts peers round-robin on the 12 GCP regions of `data/gcp-regions.tsv` (the measured
table behind the paper), `5-clusters` on five of them, `single-cluster` all in one. Same-region links are
1 ms and 2 GiB/s. `random` draws compute speeds and bandwidths from a seeded generator. A TOML or JSON
file can give peers (region, speed, memory, data holder) and either a region table or explicit matrices.
"""

from __future__ import annotations

import json
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.constants import DEFAULT_MEMORY_SLOTS, DEFAULT_MESSAGE_OVERHEAD_SECONDS, MAX_PEERS
from scheduler.swarm_view import PeerSpec, SwarmView

GIB = 1024**3
SAME_REGION_LATENCY = 0.001
SAME_REGION_BANDWIDTH = 2 * GIB
DEFAULT_SECONDS_PER_LAYER = 0.11
"""One 500M-class layer for one 8-sample microbatch on the paper's GPUs: 4 layers per stage give w = 0.44 s."""

REGION_TABLE = Path(__file__).parent / "data" / "gcp-regions.tsv"
GEO_REGIONS = ("Belgium", "Canada", "Germany", "Iowa", "Japan", "LA", "NL", "Oregon", "Singapore", "Taiwan",
               "London", "Australia")
FIVE_CLUSTERS = ("LA", "NL", "Germany", "Singapore", "Oregon")
PRESETS = ("geo-distributed", "5-clusters", "single-cluster", "random")


class ProfileError(ValueError):
    """A malformed profile file or an unknown preset."""


@lru_cache(maxsize=1)
def region_links() -> dict[tuple[str, str], tuple[float, float]]:
    """(region, region) -> (latency seconds, bandwidth bytes/s), both orders, from the bundled table."""
    table: dict[tuple[str, str], tuple[float, float]] = {}
    for line in REGION_TABLE.read_text().splitlines()[1:]:
        if not line.strip():
            continue
        a, b, lat_ms, bw_gib = line.split("\t")
        table[(a, b)] = table[(b, a)] = (float(lat_ms) / 1000, float(bw_gib) * GIB)
    return table


def region_matrices(regions: list[str], table: dict[tuple[str, str], tuple[float, float]] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Latency and bandwidth matrices for peers in `regions` (same region: 1 ms, 2 GiB/s)."""
    table = region_links() if table is None else table
    n = len(regions)
    lat = np.full((n, n), SAME_REGION_LATENCY)
    bw = np.full((n, n), float(SAME_REGION_BANDWIDTH))
    for i, a in enumerate(regions):
        for j, b in enumerate(regions):
            if a != b:
                if (a, b) not in table:
                    raise ProfileError(f"no link measurement between regions {a} and {b}")
                lat[i, j], bw[i, j] = table[(a, b)]
    return lat, bw


def preset(name: str, num_peers: int, *, seed: int = 0, memory: int = DEFAULT_MEMORY_SLOTS,
           seconds_per_layer: float = DEFAULT_SECONDS_PER_LAYER,
           message_overhead: float = DEFAULT_MESSAGE_OVERHEAD_SECONDS) -> SwarmView:
    """A swarm of `num_peers` on a named network. Peer ids are `peer-00`, `peer-01`, ..."""
    if not 1 <= num_peers <= MAX_PEERS:
        raise ProfileError(f"number of peers must be in 1..{MAX_PEERS}, got {num_peers}")
    if name == "random":
        return random_swarm(num_peers, seed=seed, memory=memory, seconds_per_layer=seconds_per_layer,
                            message_overhead=message_overhead)
    regions_by_preset = {"geo-distributed": GEO_REGIONS, "5-clusters": FIVE_CLUSTERS, "single-cluster": ("Germany",)}
    if name not in regions_by_preset:
        raise ProfileError(f"unknown profile {name!r}; presets are {', '.join(PRESETS)} (or give a .toml/.json file)")
    pool = regions_by_preset[name]
    regions = [pool[i % len(pool)] for i in range(num_peers)]
    lat, bw = region_matrices(regions)
    peers = [PeerSpec(id=f"peer-{i:02d}", seconds_per_layer=seconds_per_layer, memory_slots=memory, region=r)
             for i, r in enumerate(regions)]
    return SwarmView(peers=peers, latency=lat, bandwidth=bw, message_overhead=message_overhead)


def random_swarm(num_peers: int, *, seed: int = 0, compute_spread: float = 4.0,
                 bandwidth_range: tuple[float, float] = (10e6, 1e9),
                 latency_range: tuple[float, float] = (0.005, 0.15),
                 memory: int = DEFAULT_MEMORY_SLOTS, seconds_per_layer: float = DEFAULT_SECONDS_PER_LAYER,
                 message_overhead: float = DEFAULT_MESSAGE_OVERHEAD_SECONDS) -> SwarmView:
    """A seeded heterogeneous swarm: peers up to `compute_spread` times slower than the fastest, each with a
    home location on a plane (latency grows with distance) and an access bandwidth drawn log-uniformly from
    `bandwidth_range`; a link runs at the slower end's bandwidth, so some peers are badly connected.
    """
    if compute_spread < 1:
        raise ProfileError("compute_spread must be >= 1")
    lo, hi = bandwidth_range
    if not 0 < lo <= hi:
        raise ProfileError("bandwidth_range must be positive and ordered")
    rng = np.random.default_rng(seed)
    slow = np.exp(rng.uniform(0, np.log(compute_spread), num_peers))
    access = np.exp(rng.uniform(np.log(lo), np.log(hi), num_peers))
    xy = rng.uniform(0, 1, (num_peers, 2))
    dist = np.linalg.norm(xy[:, None, :] - xy[None, :, :], axis=-1) / np.sqrt(2)
    lat = latency_range[0] + dist * (latency_range[1] - latency_range[0])
    # Uplink of the sender and downlink of the receiver differ: asymmetric links.
    up = access * np.exp(rng.uniform(np.log(0.5), 0, num_peers))
    bw = np.minimum(up[:, None], access[None, :])
    peers = [PeerSpec(id=f"peer-{i:02d}", seconds_per_layer=seconds_per_layer * float(slow[i]), memory_slots=memory,
                      region=f"r{i}") for i in range(num_peers)]
    return SwarmView(peers=peers, latency=lat, bandwidth=bw, message_overhead=message_overhead)


def load_profile(path: str | Path) -> SwarmView:
    """A swarm from a TOML or JSON file.

    Fields: `message_overhead` (s, optional); `[[peers]]` with `id`, optional `region`, `seconds_per_layer`,
    `memory`, `data_holder`; links either as `[[links]]` entries between regions (`a`, `b`, `latency_ms`,
    `bandwidth_mib_per_s`, symmetric; missing pairs fall back to the bundled GCP table) or as matrices
    `latency_ms` and `bandwidth_mib_per_s` indexed like `peers` (asymmetric allowed).
    """
    p = Path(path)
    try:
        text = p.read_text()
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"cannot read profile {path}: {e}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"profile {path} is malformed: {e}") from None
    try:
        return parse_profile(data)
    except ProfileError:
        raise
    except (ValueError, TypeError) as e:
        raise ProfileError(f"profile {path}: {e}") from None


def parse_profile(data: Any) -> SwarmView:
    if not isinstance(data, dict):
        raise ProfileError("profile must be a table/object")
    raw_peers = data.get("peers")
    if not isinstance(raw_peers, list) or not 1 <= len(raw_peers) <= MAX_PEERS:
        raise ProfileError(f"profile needs a list `peers` of 1..{MAX_PEERS} entries")
    peers = []
    for i, rp in enumerate(raw_peers):
        if not isinstance(rp, dict):
            raise ProfileError(f"peers[{i}] must be a table")
        peers.append(PeerSpec(
            id=str(rp.get("id", f"peer-{i:02d}")),
            seconds_per_layer=_num(rp.get("seconds_per_layer", DEFAULT_SECONDS_PER_LAYER),
                                   f"peers[{i}].seconds_per_layer"),
            memory_slots=int(_num(rp.get("memory", DEFAULT_MEMORY_SLOTS), f"peers[{i}].memory")),
            region=str(rp.get("region", "")),
            data_holder=bool(rp.get("data_holder", False)),
        ))
    n = len(peers)
    overhead = _num(data.get("message_overhead", DEFAULT_MESSAGE_OVERHEAD_SECONDS), "message_overhead", zero_ok=True)
    if "latency_ms" in data or "bandwidth_mib_per_s" in data:
        try:
            lat = np.array(data["latency_ms"], dtype=float) / 1000
            bw = np.array(data["bandwidth_mib_per_s"], dtype=float) * 1024**2
        except KeyError as e:
            raise ProfileError(f"profile gives one link matrix but not {e.args[0]}") from None
        except (TypeError, ValueError):
            raise ProfileError("latency_ms and bandwidth_mib_per_s must be numeric matrices") from None
        if lat.shape != (n, n) or bw.shape != (n, n):
            raise ProfileError(f"latency_ms and bandwidth_mib_per_s must be {n}x{n} like `peers`")
    else:
        table = dict(region_links())
        for j, link in enumerate(data.get("links", [])):
            if not isinstance(link, dict) or "a" not in link or "b" not in link:
                raise ProfileError(f"links[{j}] needs regions `a` and `b`")
            entry = (_num(link.get("latency_ms"), f"links[{j}].latency_ms", zero_ok=True) / 1000,
                     _num(link.get("bandwidth_mib_per_s"), f"links[{j}].bandwidth_mib_per_s") * 1024**2)
            table[(str(link["a"]), str(link["b"]))] = table[(str(link["b"]), str(link["a"]))] = entry
        lat, bw = region_matrices([p.region for p in peers], table)
    return SwarmView(peers=peers, latency=lat, bandwidth=bw, message_overhead=overhead)


def swarm_from(name_or_file: str, num_peers: int | None, *, seed: int = 0, memory: int = DEFAULT_MEMORY_SLOTS,
               seconds_per_layer: float = DEFAULT_SECONDS_PER_LAYER) -> SwarmView:
    """A preset by name (needs `num_peers`) or a profile file by path."""
    if name_or_file in PRESETS:
        if num_peers is None:
            raise ProfileError(f"profile {name_or_file} needs a number of peers")
        return preset(name_or_file, num_peers, seed=seed, memory=memory, seconds_per_layer=seconds_per_layer)
    if Path(name_or_file).suffix.lower() in (".toml", ".json"):
        return load_profile(name_or_file)
    raise ProfileError(f"unknown profile {name_or_file!r}; presets are {', '.join(PRESETS)} or a .toml/.json file")


def _num(value: Any, name: str, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ProfileError(f"{name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise ProfileError(f"{name} must be {'non-negative' if zero_ok else 'positive'}, got {value}")
    return float(value)
