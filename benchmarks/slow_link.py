"""A link that slows mid-run (issue #19): throughput with the paths re-planned around it against paths kept.

    .venv/bin/python benchmarks/slow_link.py [--peers 6] [--runs 3] [--minutes 2] [--latency 0.3]
        [--emulate-speed 0.11] [--microbatches 4] [--modes replan,stay,steady] [--out F.json] [--keep DIR]
    .venv/bin/python benchmarks/slow_link.py --slow bandwidth [--bandwidth 50] [--slow-bandwidth 1]
        [--message-mib 4] ...   (root: network namespaces)

Each run is a real local swarm (coordinator and peer processes on loopback, 3 stages, 33% skip, the tiny model), every
peer's operations padded to `--emulate-speed` seconds per layer (the 500M-class speed of the WAN benchmarks) and every
peer given a link emulation file (`--emulate-latency`: the transport waits a link's one-way latency before each message
and before its answer; the file is read again when it changes). Once iteration 3 is committed, the link the first
plan's paths cross most often slows to `--latency` seconds one way, both ways (a congested route, a volunteer's upload
taken by another job), and a window of `--minutes` starts. Throughput is the tokens of the iterations committed
within the window over its length.

`--slow bandwidth` slows the link's bandwidth instead: every peer is a host of an `EmulatedNetwork` whose links the
kernel shapes to `--bandwidth` MB/s, every activation and gradient is padded to `--message-mib` MiB
(`swarm.message_bytes`, as the WAN benchmark's paper-sized messages; the probes and cost tables use the same size),
and the link drops to `--slow-bandwidth` MB/s both ways (`EmulatedNetwork.set_bandwidth`, open connections
included). Latency stays 0. Needs root and iproute2.

Modes, alternating within each repetition (repetition r uses seed r):
- `replan`: the run's defaults: the pipeline's sends over the link run far off its estimate, its ends re-measure and
  publish it (`swarm.peer.send_times`), and the coordinator re-plans the paths on the same placement where that
  simulates 5% quicker (`swarm.coordinator.link_drift`, event `costs_drifted`);
- `stay`: `swarm.link_drift = false`: the paths change with membership only (the probes' periodic refresh, every
  five minutes, is past the window);
- `steady`: no slowdown: the ceiling both are read against.

Prints each run (tokens/s, iterations in the window and how many left the link's data holder out for being late,
re-plans for drift and seconds from the slowdown to the first, the link's crossings in the first and the last epoch)
and min/median/max per mode, and the median ratios replan / stay and each against steady.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.repetitions import (  # noqa: E402
    alternate,
    hold_window,
    print_ratios,
    run_config,
    save,
    summarize,
    window_modes,
    window_parser,
)
from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from benchmarks.slow_holder import window_figures  # noqa: E402
from scheduler.schedule import Schedule  # noqa: E402
from swarm.coordinator.link_drift import busiest_link, crossings  # noqa: E402
from swarm.local.emulated_network import EmulatedNetwork, unavailable_reason  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.local.namespaces import write_latency_file  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

MODES = ("replan", "stay", "steady")
START_AFTER = 3
MB = 1e6


def run(args: argparse.Namespace, mode: str, index: int, root: Path) -> dict:
    n = args.peers
    swarm_lines = f"link_drift = {'false' if mode == 'stay' else 'true'}"
    if args.slow == "bandwidth":  # heavy messages through p2p daemons on 2 cores: the WAN benchmark's slower beat
        swarm_lines += f"\nmessage_bytes = {round(args.message_mib * (1 << 20))}\nheartbeat = {args.heartbeat}"
    run_dir = run_config(root, mode, index, "slowlink", args, swarm_lines)
    ids = [ensure_identity(str(run_dir / f"peer-{i:02d}.key")) for i in range(n)]
    latency = np.zeros((n, n))
    files = [write_latency_file(latency, i, ids, run_dir / f"latency-{i:02d}.json") for i in range(n)]
    peer_args = [["--iteration-deadline", "120", "--emulate-speed", str(args.emulate_speed), "--emulate-latency",
                  str(f)] for f in files]
    with contextlib.ExitStack() as stack:
        net = None
        if args.slow == "bandwidth":  # a network of its own per run: every run starts from the same shaping
            net = stack.enter_context(EmulatedNetwork(latency, np.full((n, n), args.bandwidth * MB)))

        def slow_down(a: int, b: int) -> None:
            if net is not None:
                net.set_bandwidth(a, b, args.slow_bandwidth * MB)
                net.set_bandwidth(b, a, args.slow_bandwidth * MB)
            else:
                latency[a, b] = latency[b, a] = args.latency
                for i in (a, b):
                    write_latency_file(latency, i, ids, files[i])

        swarm = LocalSwarm(run_dir, n, run_id="slowlink", network=net,
                           coordinator_args=["--config", str(run_dir / "run.toml")], peer_args=peer_args)
        return window(args, mode, index, swarm, ids, slow_down)  # stops the swarm before the network goes


def window(args: argparse.Namespace, mode: str, index: int, swarm: LocalSwarm, ids: list[str],
           slow_down: Callable[[int, int], None]) -> dict:
    """Start `swarm`, slow the first plan's busiest link down (`slow_down` of its ends' indices) once `START_AFTER`
    iterations are committed (unless `mode` is steady), measure the window from then on, and stop the swarm."""
    try:
        swarm.start()
        swarm.watch(START_AFTER, timeout=600)
        first = Schedule.from_dict(swarm.schedule())
        pair = busiest_link(first)
        if mode != "steady":
            slow_down(ids.index(pair[0]), ids.index(pair[1]))
        start = time.time()
        hold_window(swarm, start, 60 * args.minutes)
        records = swarm.metrics()
        last = Schedule.from_dict(swarm.schedules()[-1])
        drifts = [e for e in swarm.events("costs_drifted", who="coordinator") if e["time"] >= start]
        remeasured = [e for e in swarm.events("link_remeasured") if e["time"] >= start]
    finally:
        swarm.stop()
    replans = [e for e in drifts if e["replanned"]]
    holder = next((p for p in pair if first.placement[p] == 0), pair[0])  # late where its messages are
    return {"mode": mode, "run": index, **window_figures(records, start, 60 * args.minutes, holder),
            "drift_replans": len(replans), "drift_gains": [e["gain"] for e in drifts],
            "first_replan_s": round(replans[0]["time"] - start, 1) if replans else None,
            "remeasured": len(remeasured), "crossings_first": crossings(first)[pair],
            "crossings_last": crossings(last)[pair]}


def main() -> None:
    unwind_on_sigterm()
    parser = window_parser(__doc__, MODES, minutes=2.0, minutes_help="the window measured from the slowdown on",
                           emulate_speed=0.11, emulate_help="every peer's emulated seconds per layer")
    parser.add_argument("--slow", choices=("latency", "bandwidth"), default="latency", help="what of the link slows")
    parser.add_argument("--latency", type=float, default=0.3, help="one-way seconds of the slowed link")
    parser.add_argument("--bandwidth", type=float, default=50.0, help="MB/s of every link (--slow bandwidth)")
    parser.add_argument("--slow-bandwidth", type=float, default=1.0, help="MB/s of the slowed link, both ways")
    parser.add_argument("--message-mib", type=float, default=4.0, help="MiB of each activation and gradient "
                        "(--slow bandwidth; swarm.message_bytes)")
    parser.add_argument("--heartbeat", type=float, default=5.0, help="swarm.heartbeat (--slow bandwidth; 2 s "
                        "otherwise): record stores time out at a beat, and heavy messages slow them")
    args = parser.parse_args()
    modes = window_modes(args, MODES, min_peers=5,
                         more_ok=0 < args.latency <= 10 and 0.01 <= args.slow_bandwidth < args.bandwidth <= 10_000
                         and 0 < args.message_mib <= 64 and 1 <= args.heartbeat <= 30,
                         more="0 < --latency <= 10, 0.01 <= --slow-bandwidth < --bandwidth <= 10000, "
                              "0 < --message-mib <= 64, 1 <= --heartbeat <= 30")
    if args.slow == "bandwidth" and unavailable_reason():
        sys.exit(f"error: --slow bandwidth: {unavailable_reason()}")
    results = alternate(args, modes, run)
    median = summarize(results, modes, lambda mine: "crossings first/last epoch "
                       f"{[(r['crossings_first'], r['crossings_last']) for r in mine]}, first re-plan after (s) "
                       f"{[r['first_replan_s'] for r in mine]}")
    print_ratios(median, [("replan", "stay"), ("replan", "steady"), ("stay", "steady")])
    save(args, results)


if __name__ == "__main__":
    main()
