"""Jitter-aware planning: does the planner's polish on the expected makespan pay off where messages jitter?

    .venv/bin/python benchmarks/jitter_planning.py [--peers 12] [--seeds 3]

The WAN benchmark's setting without running it: 12 peers of the geo-distributed profile, 6 stages of one layer at
0.11 s, 33% skip, 4 microbatches per data holder, the tiny model's 4 x 32-token activations (64 KiB); the
message-time jitter the WAN benchmark's peers measured (run 7), and the same scaled 2x and 3x (a more loaded
network; runs 5-6 saw about twice run 7's spread). For each planner seed, the paths are planned on time (as
before) and with the polish (`PlanOptions.jitter_polish` moves scored on `jitter_draws` jittered simulations),
on the same placement; both plans are then scored on 256 fresh jittered simulations. Prints the polished plan's
expected and 90th-percentile iteration relative to the on-time plan's, and the planning time of each.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.costs import CostTables  # noqa: E402
from scheduler.expected_makespan import expected_makespan  # noqa: E402
from scheduler.path_rules import PathRules  # noqa: E402
from scheduler.planner import PlanOptions, plan, plan_tables  # noqa: E402
from scheduler.profiles import swarm_from  # noqa: E402
from scheduler.round_trips import schedule_sim_routes  # noqa: E402
from scheduler.swarm_view import ModelCost  # noqa: E402

WAN_JITTER_MS = [-5.01, -3.0, -2.04, -1.39, -0.8, -0.41, -0.1, 0.0, 0.0, 0.02, 0.46, 1.31, 2.25, 3.76, 6.44,
                 13.73]
"""Message-time deviations the peers measured on the emulated WAN (BENCHMARKS "WAN", run 7, SkipPipe)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    view = dataclasses.replace(swarm_from("geo-distributed", args.peers, seed=0, seconds_per_layer=0.11),
                               message_overhead=0.0)  # as a live swarm: probes include the per-message cost
    model = ModelCost.balanced(num_layers=6, num_stages=6, activation_bytes=4 * 32 * 128 * 4)
    rules = PathRules.from_skip_ratio(6, 0.33)
    options = PlanOptions(microbatches_per_holder=4)
    placed = plan(view, model, rules, dataclasses.replace(options, jitter_polish=0))
    tables = CostTables.from_view(view, model)
    stage_of = np.array([placed.placement.get(p, -1) for p in tables.ids])
    print(f"{args.peers} peers (geo-distributed), 6 stages, 33% skip, 4 microbatches per holder; "
          f"{len(placed.data_holders)} data holders")
    for scale in (1, 2, 3):
        jittery = dataclasses.replace(tables, jitter=np.array(WAN_JITTER_MS) * scale / 1e3)
        mean_ratio, p90_ratio, times = [], [], {"on time": [], "polished": []}
        for seed in range(args.seeds):
            scored = {}
            for name, polish in (("on time", 0), ("polished", options.jitter_polish)):
                t0 = time.perf_counter()
                schedule = plan_tables(jittery, rules, dataclasses.replace(options, seed=seed, jitter_polish=polish),
                                       stage_of=stage_of)
                times[name].append(time.perf_counter() - t0)
                scored[name] = expected_makespan(jittery, schedule_sim_routes(schedule, jittery), draws=256,
                                                 seed=1000 + seed)
            mean_ratio.append(scored["polished"].mean / scored["on time"].mean)
            p90_ratio.append(scored["polished"].p90 / scored["on time"].p90)
            print(f"  jitter x{scale}, seed {seed}: on-time plan {scored['on time'].mean:.3f} s expected "
                  f"(p90 {scored['on time'].p90:.3f}), polished {scored['polished'].mean:.3f} s "
                  f"(p90 {scored['polished'].p90:.3f})")
        print(f"jitter x{scale}: polished / on-time plan: expected {statistics.mean(mean_ratio):.3f}, "
              f"p90 {statistics.mean(p90_ratio):.3f} (mean over {args.seeds} seeds); planning "
              f"{statistics.mean(times['on time']):.2f} s on time, "
              f"{statistics.mean(times['polished']):.2f} s polished")


if __name__ == "__main__":
    main()
