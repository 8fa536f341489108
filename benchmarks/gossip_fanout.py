"""Gossip at a coordinator's fan-out: one hub sidecar linked to more peers than GossipSub's usual mesh degree.

    .venv/bin/python benchmarks/gossip_fanout.py [--spokes 16] [--links 0] [--messages 30] [--runs 3]

A coordinator's sidecar is every peer's bootstrap link, and a joiner has no other link until it is admitted. With
GossipSub's usual high degree of 12, the hub prunes its mesh to 6 peers from 13 on, and py-libp2p 0.8 then delivers
the hub's messages to the others only by lazy gossip, if at all. Our sidecars keep meshes up to
`gossip_sidecar.GOSSIP_DEGREE_HIGH` peers; this measures both settings in the same run, alternating.

Each run: a hub and `--spokes` sidecars, each spoke linked to the hub and to `--links` random other spokes (0: all
joiners before their admission; members keep a few links), all subscribed to one topic; after `--settle` seconds
the hub publishes `--messages` messages, one every `--pace` seconds. Prints per setting: the share of (spoke,
message) pairs delivered within `--timeout` s, their latency (median / p90), and the GRAFT floods the sidecars
logged; min / median / max over `--runs`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.control.gossip import GossipClient, GossipMessage, schedule_topic  # noqa: E402
from swarm.control.gossip_sidecar import GOSSIP_DEGREE_HIGH  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

TOPIC = schedule_topic("fanout")
SETTINGS = {"mesh high degree 12 (GossipSub's usual)": 12, f"mesh high degree {GOSSIP_DEGREE_HIGH} (ours)": None}


class Arrivals:
    """When each message number reached one owner's callback."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self.lock = threading.Lock()

    def __call__(self, message: GossipMessage) -> None:
        with self.lock:
            self.times.setdefault(message.payload["i"], time.monotonic())


def run(args: argparse.Namespace, degree_high: int | None, seed: int, tmp: Path) -> dict:
    rng = random.Random(seed)
    n = args.spokes + 1
    keys = [str(tmp / f"{i}.key") for i in range(n)]
    for k in keys:
        ensure_identity(k)
    arrivals = [Arrivals() for _ in range(n)]
    logs = [str(tmp / f"{i}.log") for i in range(n)]
    clients = [GossipClient(on_message=arrivals[i]) for i in range(n)]
    try:
        hub = clients[0]
        hub.start(keys[0], log_path=logs[0], degree_high=degree_high)
        with ThreadPoolExecutor(8) as pool:  # the hub is every spoke's bootstrap, as the coordinator is every peer's
            list(pool.map(lambda i: clients[i].start(keys[i], bootstrap=hub.info.maddrs[:1], log_path=logs[i],
                                                     degree_high=degree_high), range(1, n)))
        for i in range(1, n):
            others = [j for j in range(1, n) if j != i]
            for j in rng.sample(others, min(args.links, len(others))):
                clients[i].connect(clients[j].info.maddrs[0])
        for c in clients:
            c.subscribe(TOPIC)
        time.sleep(args.settle)
        sent = {}
        for i in range(args.messages):
            sent[i] = time.monotonic()
            hub.publish(TOPIC, {"i": i})
            time.sleep(args.pace)
        time.sleep(args.timeout)
    finally:
        for c in clients:
            c.close()
    latencies, delivered = [], 0
    for a in arrivals[1:]:
        for i, t0 in sent.items():
            t = a.times.get(i)
            if t is not None and t - t0 <= args.timeout:
                delivered += 1
                latencies.append(t - t0)
    floods = sum(Path(f).read_text(errors="replace").count("GRAFT flood") for f in logs if os.path.exists(f))
    return {"delivered": delivered / (args.spokes * args.messages), "latencies": latencies, "floods": floods}


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    values = sorted(values)
    return " / ".join(fmt.format(v) for v in (values[0], statistics.median(values), values[-1])) if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spokes", type=int, default=16)
    parser.add_argument("--links", type=int, default=0, help="links from each spoke to other spokes")
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--pace", type=float, default=0.5, help="seconds between the hub's messages")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds from subscribing to the first message")
    parser.add_argument("--timeout", type=float, default=10.0, help="a message later than this is lost")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.spokes < 1 or args.messages < 1 or args.runs < 1 or args.links < 0:
        sys.exit("error: need --spokes >= 1, --messages >= 1, --runs >= 1, --links >= 0")
    figures: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for rep in range(args.runs):
        for name, degree in SETTINGS.items():
            with tempfile.TemporaryDirectory(prefix="gossip-fanout-") as tmp:
                r = run(args, degree, rep, Path(tmp))
            figures[name].append(r)
            lat = sorted(r["latencies"])
            print(f"run {rep} {name}: delivered {r['delivered']:.1%}, latency median "
                  f"{statistics.median(lat) * 1e3 if lat else float('nan'):.0f} ms, max "
                  f"{lat[-1] * 1e3 if lat else float('nan'):.0f} ms, {r['floods']} GRAFT floods", flush=True)
    print(f"\nhub + {args.spokes} spokes ({args.links} links each to other spokes), {args.messages} messages, "
          f"{args.runs} runs; min / median / max over runs:")
    for name, runs in figures.items():
        med = [statistics.median(r["latencies"]) * 1e3 for r in runs if r["latencies"]]
        p90 = [sorted(r["latencies"])[int(0.9 * (len(r["latencies"]) - 1))] * 1e3 for r in runs if r["latencies"]]
        print(f"  {name}: delivered {spread([r['delivered'] * 100 for r in runs], '{:.1f}%')}; latency median "
              f"{spread(med, '{:.0f}')} ms, p90 {spread(p90, '{:.0f}')} ms; GRAFT floods "
              f"{spread([r['floods'] for r in runs], '{:.0f}')}")


if __name__ == "__main__":
    main()
