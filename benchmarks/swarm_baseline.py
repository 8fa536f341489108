"""SkipPipe vs the DT-FM full pipeline vs the SWARM-style baseline, simulated (issue #19, "fair baselines").

    .venv/bin/python benchmarks/swarm_baseline.py            # geo-20 reference instance + random swarms, 3 seeds
    .venv/bin/python benchmarks/swarm_baseline.py --quick    # 20-peer random swarms only

Per seed and method, the simulated iteration (s) of the same work (every data holder's microbatches):
- SkipPipe: its own placement and paths (33% skip: 4 of 6 stages per path);
- full pipeline: DT-FM columns tuned on the simulator, on SkipPipe's placement, and on its own placement (searched on
  its columns' simulated iteration, as the runtime's first plan does since the full pipeline got its own placement);
- SWARM: stochastic wiring on its own placement (throughput-balanced, then tuned on the simulated mean over 8 wiring
  draws, as the runtime plans it); "one draw" is what a schedule carries for a whole epoch (the runtime keeps it),
  "redrawn" the mean over DRAWS independent draws (a fresh wiring every iteration, as SWARM runs; none of them a
  draw the placement was tuned on). Two checks of fairness: SWARM on the throughput-balanced placement alone, and on
  SkipPipe's placement.
Prints min/median/max over the seeds and ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.baselines import tune_columns  # noqa: E402
from scheduler.costs import CostTables  # noqa: E402
from scheduler.instance import load_instance  # noqa: E402
from scheduler.path_rules import PathRules  # noqa: E402
from scheduler.paths import PathProblem, evaluate, plan_paths  # noqa: E402
from scheduler.placement import PlacementGoal, place  # noqa: E402
from scheduler.planner import default_model, swarm_own_placement  # noqa: E402
from scheduler.profiles import random_swarm  # noqa: E402
from scheduler.swarm_balance import swarm_placement  # noqa: E402
from scheduler.swarm_wiring import expected_makespan_over_draws, redraw  # noqa: E402

ASSET = Path("/work/shared/data/reference-geo20.json")
if not ASSET.exists():
    ASSET = Path(__file__).resolve().parent.parent / "tests" / "assets" / "reference-geo20.json"
DRAWS = 32
EVAL_SEED = 1000
"""Offset of the wiring seeds scored here from those the placement was tuned on."""
METHODS = ("skippipe", "full", "full_own", "swarm_one", "swarm_redrawn", "swarm_balanced", "swarm_on_skippipe")
LABELS = {"skippipe": "SkipPipe", "full": "full pipeline, SkipPipe's placement",
          "full_own": "full pipeline, own placement", "swarm_one": "SWARM, one draw per epoch",
          "swarm_redrawn": f"SWARM, redrawn (mean of {DRAWS})",
          "swarm_balanced": "SWARM, throughput placement only (redrawn)",
          "swarm_on_skippipe": "SWARM on SkipPipe's placement (redrawn)"}


def one_case(tables: CostTables, num_stages: int, skip_rules: PathRules, mb: int, seed: int,
             pinned: dict[int, int] | None = None) -> dict[str, float]:
    """Every method's simulated iteration on one swarm."""
    full_rules = PathRules(num_stages, num_stages, max_swaps=0)
    goal = PlacementGoal(rules=skip_rules, microbatches_per_holder=mb)
    ours_stage = place(tables, goal, pinned=pinned, seed=seed, iterations=100)
    holders = tuple(int(h) for h in np.flatnonzero(ours_stage == 0))
    counts = (mb,) * len(holders)
    ours = plan_paths(PathProblem(tables, ours_stage, holders, counts, skip_rules), seed=seed).makespan
    full = tune_columns(PathProblem(tables, ours_stage, holders, counts, full_rules), seed=seed, iterations=300)[1]
    columns_goal = PlacementGoal(rules=full_rules, microbatches_per_holder=mb, columns=True)
    full_stage = place(tables, columns_goal, pinned={h: 0 for h in holders}, seed=seed, iterations=100)
    full_own = tune_columns(PathProblem(tables, full_stage, holders, counts, full_rules), seed=seed,
                            iterations=300)[1]
    balanced = swarm_placement(tables, num_stages, len(holders), pinned={h: 0 for h in holders})
    swarm_stage = swarm_own_placement(tables, ours_stage, num_stages, mb, seed=seed)
    swarm_problem = PathProblem(tables, swarm_stage, holders, counts, full_rules)

    def redrawn(stage_of: np.ndarray) -> float:
        problem = PathProblem(tables, stage_of, holders, counts, full_rules)
        return float(np.mean(expected_makespan_over_draws(problem, seed=seed + EVAL_SEED, draws=DRAWS)))

    one = evaluate(swarm_problem, redraw(swarm_problem, seed + EVAL_SEED, 0, 0), "backward_first")[1].makespan
    return {"skippipe": ours, "full": full, "full_own": full_own, "swarm_one": one,
            "swarm_redrawn": redrawn(swarm_stage), "swarm_balanced": redrawn(balanced),
            "swarm_on_skippipe": redrawn(ours_stage)}


def report(title: str, rows: list[dict[str, float]]) -> None:
    print(f"\n## {title}: {len(rows)} seeds, simulated iteration (s) min / median / max")
    for m in METHODS:
        v = np.array([r[m] for r in rows])
        print(f"{LABELS[m]:42s} {v.min():8.2f} / {np.median(v):8.2f} / {v.max():8.2f}")
    for num, den in (("skippipe", "full"), ("skippipe", "full_own"), ("skippipe", "swarm_redrawn"),
                     ("swarm_redrawn", "full"), ("swarm_redrawn", "full_own"),
                     ("swarm_one", "swarm_redrawn"), ("swarm_redrawn", "swarm_balanced"),
                     ("swarm_redrawn", "swarm_on_skippipe")):
        v = np.array([r[num] / r[den] for r in rows])
        print(f"ratio {num} / {den}: {v.min():.3f} / {np.median(v):.3f} / {v.max():.3f}")


def reference(seeds: list[int]) -> None:
    inst = load_instance(ASSET, reference_gaps=True)
    pinned = {v: 0 for v in inst.data_holders}
    rows = []
    for seed in seeds:
        t0 = time.perf_counter()
        rows.append(one_case(inst.tables, inst.num_stages, PathRules(inst.num_stages, inst.stages_per_path),
                             inst.microbatches_per_holder, seed, pinned))
        print(f"seed {seed}: " + ", ".join(f"{m} {rows[-1][m]:.2f}" for m in METHODS) +
              f" ({time.perf_counter() - t0:.1f} s)")
    report(f"reference geo-20 instance ({ASSET.name}, reference gaps, 5 data holders x "
           f"{inst.microbatches_per_holder} microbatches)", rows)


def random_swarms(n: int, seeds: list[int]) -> None:
    rows = []
    for seed in seeds:
        t0 = time.perf_counter()
        tables = CostTables.from_view(random_swarm(n, seed=seed), default_model(6))
        rows.append(one_case(tables, 6, PathRules(6, 4), 6, seed))
        print(f"seed {seed}: " + ", ".join(f"{m} {rows[-1][m]:.2f}" for m in METHODS) +
              f" ({time.perf_counter() - t0:.1f} s)")
    report(f"random heterogeneous swarms of {n} peers (compute 4x, 10 MB/s - 1 GB/s links), 6 stages, 6 microbatches "
           f"per data holder", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    seeds = list(range(max(3, args.seeds)))
    if not args.quick:
        reference(seeds)
    random_swarms(20, seeds)
    if not args.quick:
        random_swarms(40, seeds)


if __name__ == "__main__":
    main()
