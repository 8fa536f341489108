"""Peers behind NAT: activation transfer through the coordinator's relay against a direct one, and a swarm's
iteration with half its peers at home against the same swarm all public. Needs root, iproute2 and iptables.

``transfer``: a NAT network (`swarm.local.nat_network.NatNetwork`) with a relay (a public host running
`swarm.net.forwarding.Forwarder`, as a coordinator started with ``--relay`` does), a sender and a public receiver on
the hub, and a receiver at home behind a router that drops inbound connections. Every host's uplink is shaped to
the same rate (HTB), so both paths cross links of one capacity; the relayed one crosses two (sender -> relay ->
home). For each size the sender times `Transport.send` (delivered and acknowledged) to each receiver, alternating,
and the round trip of a 1 KiB probe; each run starts fresh processes.

``swarm``: the same local swarm (2 stages, the same seeds, 4 peers) run in a NAT network with every peer public, and
with two of them at home behind two routers (``--reachability relayed``, coordinator ``--relay``), same uplinks;
the median iteration time over the run's iterations after the first.

Every figure is over ``--runs`` fresh runs (min/median/max), with the ratio relayed / direct.

    .venv/bin/python benchmarks/relay.py transfer [--runs 3] [--sizes 1048576,16777216] [--uplink 12.5e6]
    .venv/bin/python benchmarks/relay.py swarm [--runs 3] [--iterations 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.local.nat_network import NatNetwork, unavailable_reason  # noqa: E402

PROBE_BYTES = 1024
RELAY, SENDER, PUBLIC, HOME = 0, 1, 2, 3
HOMES = [None, None, None, 0]


# ---- one process per host (run inside its namespace) -----------------------------------------------------------
def node(role: str, host: str, out: str, initial: str, sizes: list[int], repeats: int) -> None:
    """A relay, a receiver (public or home) or the sender; writes `out/ROLE.json` when ready (and the sender its
    timings), then waits for `out/stop`."""
    import hivemind
    import torch

    from swarm.net.dht_shutdown import stop_dht
    from swarm.net.forwarding import Forwarder
    from swarm.net.reachability import circuit_addresses, dht_options
    from swarm.net.transport import Transport
    from swarm.wire import Direction, HopHeader

    initial_peers = [initial] if initial else []
    reach = {"relay": "public", "home": "relayed"}.get(role)
    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=[f"/ip4/{host}/tcp/0"], start=True,
                       **dht_options(reach, relays=initial_peers))
    me = dht.peer_id.to_base58()
    info = {"id": me, "maddrs": [str(a) for a in dht.get_visible_maddrs()]}
    circuits = {me: circuit_addresses(initial_peers, me)} if role == "home" else {}
    closers = []
    if role == "relay":
        forwarder = Forwarder(dht, lambda peer: True)
        closers.append(forwarder.shutdown)
    else:
        transport = Transport(dht, lambda *msg: None, addresses=lambda peer: circuits.get(peer, []))
        closers.append(transport.shutdown)
    if role == "home":
        info["circuits"] = circuits[me]
    Path(out, f"{role}.json").write_text(json.dumps(info))
    if role == "sender":
        targets = json.loads(Path(out, "targets.json").read_text())
        circuits.update({targets["home"]: json.loads(Path(out, "home.json").read_text())["circuits"]})
        timings: dict[str, dict[str, list[float]]] = {name: {} for name in targets}

        def send(peer: str, size: int, i: int) -> float:
            header = HopHeader(run="bench", iteration=i, microbatch=0, route=(me, peer), hop=1,
                               direction=Direction.FORWARD, epoch=0, dtype="float32", shape=())
            tensor = torch.zeros(size // 4)
            start = time.perf_counter()
            transport.send(peer, header, tensor, timeout=300)
            return time.perf_counter() - start
        for peer in targets.values():  # warm up: streams open, the relayed peer found through its relay
            send(peer, 1024, 0)
        for i in range(repeats):
            for name, peer in (list(targets.items()) if i % 2 == 0 else list(targets.items())[::-1]):
                timings[name].setdefault("probe", []).append(transport.probe(peer, PROBE_BYTES))
                for size in sizes:
                    timings[name].setdefault(str(size), []).append(send(peer, size, i + 1))
        Path(out, "timings.json").write_text(json.dumps(timings))
    while not Path(out, "stop").exists():
        time.sleep(0.2)
    for close in closers:
        close()
    stop_dht(dht)


def _wait_file(path: Path, timeout: float, procs: list[subprocess.Popen]) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError(f"{path.name} did not appear (a node failed or timed out)")
        time.sleep(0.2)
    return json.loads(path.read_text())


def transfer_run(sizes: list[int], repeats: int, uplink: float, tag: str) -> dict:
    """One run: fresh network and processes; seconds per send and probe, by receiver ("public", "home") and size."""
    out = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    procs: list[subprocess.Popen] = []
    with NatNetwork(HOMES, uplink=uplink, tag=tag) as net:
        def start(role: str, i: int, initial: str = "") -> None:
            cmd = [*net.exec_prefix(i), sys.executable, __file__, "_node", role, net.host(i), str(out), initial,
                   ",".join(map(str, sizes)), str(repeats)]
            log = open(out / f"{role}.log", "w")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        try:
            start("relay", RELAY)
            relay = _wait_file(out / "relay.json", 60, procs)
            initial = next(a for a in relay["maddrs"] if net.host(RELAY) in a)
            start("public", PUBLIC, initial)
            start("home", HOME, initial)
            targets = {"public": _wait_file(out / "public.json", 60, procs)["id"],
                       "home": _wait_file(out / "home.json", 60, procs)["id"]}
            (out / "targets.json").write_text(json.dumps(targets))
            start("sender", SENDER, initial)
            return _wait_file(out / "timings.json", 600, procs)
        finally:
            (out / "stop").touch()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def transfer(args: argparse.Namespace) -> dict:
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = [transfer_run(sizes, args.repeats, args.uplink, f"rb{i}") for i in range(args.runs)]
    report = {"uplink_bytes_per_s": args.uplink, "runs": args.runs, "repeats": args.repeats, "results": {}}
    for key in ["probe", *map(str, sizes)]:
        per_run = {name: [statistics.median(r[name][key]) for r in runs] for name in ("public", "home")}
        ratio = [h / p for h, p in zip(per_run["home"], per_run["public"])]
        size = PROBE_BYTES if key == "probe" else int(key)
        row = {"direct_s": spread(per_run["public"]), "relayed_s": spread(per_run["home"]),
               "relayed/direct": spread(ratio)}
        if key != "probe":
            row["direct_MBps"] = size / 1e6 / statistics.median(per_run["public"])
            row["relayed_MBps"] = size / 1e6 / statistics.median(per_run["home"])
        report["results"]["1KiB round trip" if key == "probe" else f"{size / 2**20:g} MiB"] = row
    return report


# ---- swarm iteration time --------------------------------------------------------------------------------------
def swarm_run(homes: list[int | None], iterations: int, uplink: float, tag: str) -> float:
    """Median seconds per iteration (after the first) of a 4-peer, 2-stage local swarm whose peer i sits in host i."""
    relayed = any(h is not None for h in homes)
    tmp = tempfile.mkdtemp(prefix="relay-swarm-")  # kept: the logs of a failed run
    with NatNetwork(homes, uplink=uplink, tag=tag) as net:
        peer_args = [["--stage", str(s)] + (["--reachability", "relayed"] if homes[i] is not None else [])
                     for i, s in enumerate((0, 1, 1, 0))]
        coordinator = ["--iterations", str(iterations), "--min-peers", "4", "--stages", "2", "--skip", "0",
                       "--seed", "0", "--microbatches", "2"] + (["--relay"] if relayed else [])
        swarm = LocalSwarm(tmp, 4, run_id="relaybench", coordinator_args=coordinator, peer_args=peer_args,
                           network=net)
        try:
            swarm.start()
            records = swarm.watch(iterations, timeout=600)
        finally:
            swarm.stop()
    return statistics.median(r["iteration_seconds"] for r in records[1:])


def swarm(args: argparse.Namespace) -> dict:
    # peers 0 and 3 hold stage 0, 1 and 2 stage 1; at home: 1 and 2, behind two routers, so stage 1's two copies
    # exchange their averages, and stage 0 its activations with them, through the relay
    layouts = {"all public": [None] * 4, "half at home": [None, 0, 1, None]}
    times: dict[str, list[float]] = {name: [] for name in layouts}
    for i in range(args.runs):
        for name, homes in (layouts.items() if i % 2 == 0 else list(layouts.items())[::-1]):
            times[name].append(swarm_run(homes, args.iterations, args.uplink, f"rs{i}{len(times[name])}"))
    ratio = [h / p for h, p in zip(times["half at home"], times["all public"])]
    return {"uplink_bytes_per_s": args.uplink, "runs": args.runs, "iterations": args.iterations,
            "iteration_s": {name: spread(v) for name, v in times.items()}, "home/public": spread(ratio)}


def main() -> None:
    unwind_on_sigterm()
    if len(sys.argv) > 1 and sys.argv[1] == "_node":
        role, host, out, initial, sizes, repeats = sys.argv[2:8]
        node(role, host, out, initial, [int(s) for s in sizes.split(",")], int(repeats))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("transfer", "swarm"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="transfer: sends per size and receiver in a run")
    parser.add_argument("--sizes", default="1048576,16777216", help="transfer: message bytes, comma-separated")
    parser.add_argument("--iterations", type=int, default=8, help="swarm: iterations per run")
    parser.add_argument("--uplink", type=float, default=12.5e6, help="bytes/s of every host's uplink (100 Mbit/s)")
    parser.add_argument("--out", type=Path, help="write the report here as JSON too")
    args = parser.parse_args()
    if (why := unavailable_reason()) is not None or os.geteuid() != 0:
        sys.exit(f"relay benchmark: {why or 'needs root (network namespaces)'}")
    report = {"what": args.what, "date": time.strftime("%Y-%m-%d"),
              **(transfer(args) if args.what == "transfer" else swarm(args))}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
