"""A link that slows mid-run (issue #19): throughput with the paths re-planned around it against paths kept.

    .venv/bin/python benchmarks/slow_link.py [--peers 6] [--runs 3] [--minutes 2] [--latency 0.3]
        [--emulate-speed 0.11] [--microbatches 4] [--modes replan,stay,steady] [--out F.json] [--keep DIR]

Each run is a real local swarm (coordinator and peer processes on loopback, 3 stages, 33% skip, the tiny model), every
peer's operations padded to `--emulate-speed` seconds per layer (the 500M-class speed of the WAN benchmarks) and every
peer given a link emulation file (`--emulate-latency`: the transport waits a link's one-way latency before each message
and before its answer; the file is read again when it changes). Once iteration 3 is committed, the link the first
plan's paths cross most often slows to `--latency` seconds one way, both ways (a congested route, a volunteer's upload
taken by another job), and a window of `--minutes` starts. Throughput is the tokens of the iterations committed
within the window over its length.

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
import sys
import time
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
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.local.namespaces import write_latency_file  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

MODES = ("replan", "stay", "steady")
START_AFTER = 3


def run(args: argparse.Namespace, mode: str, index: int, root: Path) -> dict:
    run_dir = run_config(root, mode, index, "slowlink", args, f"link_drift = {'false' if mode == 'stay' else 'true'}")
    ids = [ensure_identity(str(run_dir / f"peer-{i:02d}.key")) for i in range(args.peers)]
    latency = np.zeros((args.peers, args.peers))
    files = [write_latency_file(latency, i, ids, run_dir / f"latency-{i:02d}.json") for i in range(args.peers)]
    peer_args = [["--iteration-deadline", "120", "--emulate-speed", str(args.emulate_speed), "--emulate-latency",
                  str(f)] for f in files]
    swarm = LocalSwarm(run_dir, args.peers, run_id="slowlink",
                       coordinator_args=["--config", str(run_dir / "run.toml")], peer_args=peer_args)
    try:
        swarm.start()
        swarm.watch(START_AFTER, timeout=600)
        first = Schedule.from_dict(swarm.schedule())
        pair = busiest_link(first)
        if mode != "steady":
            a, b = ids.index(pair[0]), ids.index(pair[1])
            latency[a, b] = latency[b, a] = args.latency
            for i in (a, b):
                write_latency_file(latency, i, ids, files[i])
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
    parser.add_argument("--latency", type=float, default=0.3, help="one-way seconds of the slowed link")
    args = parser.parse_args()
    modes = window_modes(args, MODES, min_peers=5, more_ok=0 < args.latency <= 10, more="0 < --latency <= 10")
    results = alternate(args, modes, run)
    median = summarize(results, modes, lambda mine: "crossings first/last epoch "
                       f"{[(r['crossings_first'], r['crossings_last']) for r in mine]}, first re-plan after (s) "
                       f"{[r['first_replan_s'] for r in mine]}")
    print_ratios(median, [("replan", "stay"), ("replan", "steady"), ("stay", "steady")])
    save(args, results)


if __name__ == "__main__":
    main()
