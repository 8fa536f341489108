"""A relay slower than it announced, but not slow enough to bench (issue #19): throughput with the plans on the
peers' measured speeds against plans on their announced ones.

    .venv/bin/python benchmarks/drifted_speed.py [--peers 6] [--runs 3] [--minutes 2.5] [--drift 1.8]
        [--emulate-speed 0.11] [--microbatches 4] [--modes measured,announced,steady] [--out F.json] [--keep DIR]

Each run is a real local swarm (coordinator and peer processes on loopback, 3 stages, 33% skip, the tiny model), every
peer's operations padded to `--emulate-speed` seconds per layer (the 500M-class speed of the WAN benchmarks): compute
is what an iteration waits for, as on GPUs over a fast network. Two peers ask for stage 1 (`--stage 1`), so the
victim has a stage mate; the victim announces the common speed but runs `--drift` times slower from its start
(`--emulate-drift`: a machine whose owner started a job after it measured itself). 1.8x is below the 2x at which a
relay is benched (`SlowRelays`), so only the plans can do anything about it. Throughput is the tokens of the iterations
committed within the `--minutes` window that starts once iteration 3 is committed, over its length.

Modes, alternating within each repetition (repetition r uses seed r):
- `measured`: `swarm.measured_speeds = true` (off by default; on in this mode and in `steady`): once two of the
  victim's pace reports show it, the paths are re-planned on its measured speed from the next iteration, where the
  re-plan's simulated iteration is 5% shorter (`swarm.coordinator.measured_speeds`, `swarm.coordinator.cost_drift`);
- `announced`: `swarm.measured_speeds = false` (the run's default): every plan takes the announced speeds;
- `steady`: no drift (the same pins): the ceiling both are read against.

Prints each run (tokens/s, iterations in the window, re-plans for drift and their simulated gain, the victim's share of
the hops in the first and the last epoch, benches) and min/median/max per mode, and the median ratios measured /
announced and each against steady.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

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
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

MODES = ("measured", "announced", "steady")
START_AFTER = 3


def hop_share(schedule: dict, peer: str) -> float:
    """The fraction of the hops of `schedule`'s paths (stages past 0) that `peer` serves."""
    hops = [p for r in schedule["routes"] for p in r["peers"]]
    return round(sum(p == peer for p in hops) / max(1, len(hops)), 3)


def run(args: argparse.Namespace, mode: str, index: int, root: Path) -> dict:
    run_dir = run_config(root, mode, index, "drift", args,
                         f"measured_speeds = {'false' if mode == 'announced' else 'true'}")
    config = run_dir / "run.toml"
    common = ["--iteration-deadline", "120", "--emulate-speed", str(args.emulate_speed)]
    victim_args = ["--stage", "1", *(["--emulate-drift", str(args.drift)] if mode != "steady" else [])]
    peer_args = [common + (["--stage", "1"] if i == args.peers - 2 else victim_args if i == args.peers - 1 else [])
                 for i in range(args.peers)]
    swarm = LocalSwarm(run_dir, args.peers, run_id="drift", coordinator_args=["--config", str(config)],
                       peer_args=peer_args)
    try:
        swarm.start()
        swarm.watch(START_AFTER, timeout=600)
        ids = {i: ensure_identity(str(run_dir / f"peer-{i:02d}.key")) for i in range(args.peers)}
        victim = ids[args.peers - 1]
        start = time.time()
        hold_window(swarm, start, 60 * args.minutes)
        records = swarm.metrics()
        epochs = swarm.schedules()
        drifts = swarm.events("costs_drifted", who="coordinator")
        benches = swarm.events("relay_benched", who="coordinator") + swarm.events("holder_benched", who="coordinator")
    finally:
        swarm.stop()
    return {"mode": mode, "run": index, **window_figures(records, start, 60 * args.minutes, victim),
            "epochs": len(epochs), "drift_replans": sum(e["replanned"] for e in drifts),
            "drift_gains": [e["gain"] for e in drifts],
            "victim_measured": [e["peers"].get(victim) for e in drifts],
            "victim_hops_first": hop_share(epochs[0], victim), "victim_hops_last": hop_share(epochs[-1], victim),
            "benched": len(benches)}


def main() -> None:
    unwind_on_sigterm()
    parser = window_parser(__doc__, MODES, minutes=2.5, minutes_help="the window measured from iteration 3 on",
                           emulate_speed=0.11, emulate_help="every peer's emulated seconds per layer")
    parser.add_argument("--drift", type=float, default=1.8, help="times slower than announced the victim runs")
    args = parser.parse_args()
    modes = window_modes(args, MODES, min_peers=5, more_ok=1 < args.drift <= 100, more="1 < --drift <= 100")
    results = alternate(args, modes, run)
    median = summarize(results, modes, lambda mine: "victim's hops first/last epoch "
                       f"{[(r['victim_hops_first'], r['victim_hops_last']) for r in mine]}")
    print_ratios(median, [("measured", "announced"), ("measured", "steady"), ("announced", "steady")])
    save(args, results)

if __name__ == "__main__":
    main()
