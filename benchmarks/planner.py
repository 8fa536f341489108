"""Planner quality and speed: the numbers of the scheduler issue, measured in one run.

    .venv/bin/python benchmarks/planner.py            # full run (a few minutes)
    .venv/bin/python benchmarks/planner.py --quick    # fewer seeds and sizes

Prints ratios against baselines measured in the same run; paste the output into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the target says
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.baselines import full_pipeline, random_skip, tune_columns  # noqa: E402
from scheduler.costs import CostTables  # noqa: E402
from scheduler.instance import load_instance, reference_routes  # noqa: E402
from scheduler.path_rules import PathRules  # noqa: E402
from scheduler.paths import PathProblem, RouteFinder, evaluate, plan_paths  # noqa: E402
from scheduler.placement import PlacementGoal, place  # noqa: E402
from scheduler.planner import default_model, problem_for  # noqa: E402
from scheduler.profiles import random_swarm  # noqa: E402
from scheduler.simulator import simulate  # noqa: E402
from scheduler.swarm_view import SwarmView  # noqa: E402

ASSET = Path(__file__).resolve().parent.parent / "tests" / "assets" / "reference-geo20.json"


def lower_bound(problem: PathProblem) -> float:
    """No schedule beats this: each of a holder's memory slots serves its microbatches one after another,
    each taking at least the holder's best isolated round trip; and no peer computes faster than its share."""
    finder = RouteFinder(problem)
    zero = np.zeros(problem.tables.num_peers)
    t = problem.tables
    bound = 0.0
    for h, m in zip(problem.holders, problem.microbatches):
        best = finder.ranked(h, zero)[0][0] + (1 + t.backward_factor) * t.forward[h, 0] + t.loss_times()[h]
        bound = max(bound, -(-m // int(t.memory[h])) * best)
    return bound


def reference_section() -> None:
    inst = load_instance(ASSET, reference_gaps=True)
    stage_of = np.full(20, -1)
    for s, part in enumerate(inst.partitions):
        stage_of[list(part)] = s
    rules = PathRules(6, 4)
    problem = PathProblem(inst.tables, stage_of, inst.data_holders, (6,) * 5, rules)
    full = evaluate(PathProblem(inst.tables, stage_of, inst.data_holders, (6,) * 5, PathRules(6, 6)),
                    full_pipeline(PathProblem(inst.tables, stage_of, inst.data_holders, (6,) * 5, PathRules(6, 6))),
                    "backward_first")[1].makespan
    t0 = time.perf_counter()
    ours = plan_paths(problem, seed=0)
    t_paths = time.perf_counter() - t0
    ref = simulate(inst.tables, reference_routes(inst, "skippipe")).makespan
    goal = PlacementGoal(rules=rules, microbatches_per_holder=6)
    t0 = time.perf_counter()
    own_stage = place(inst.tables, goal, pinned={v: 0 for v in inst.data_holders}, seed=0, iterations=100)
    own = plan_paths(PathProblem(inst.tables, own_stage, inst.data_holders, (6,) * 5, rules), seed=0)
    t_own = time.perf_counter() - t0
    print("## reference geo-20 instance (reference simulator gaps)")
    print(f"reference SkipPipe paths          {ref:8.2f} s")
    print(f"our paths, reference placement    {ours.makespan:8.2f} s  ({ours.makespan / full:.3f} x our full pipeline "
          f"{full:.2f} s with all 30 microbatches; paths planned in {t_paths:.2f} s)")
    print(f"our placement + our paths         {own.makespan:8.2f} s  ({own.makespan / full:.3f} x; planned in "
          f"{t_own:.2f} s)")
    print(f"lower bound                       {lower_bound(problem):8.2f} s")


def heterogeneous(seeds: list[int], sizes: list[int], uniform_network: bool = False) -> None:
    title = "heterogeneous compute (4x spread), uniform 1 GB/s network" if uniform_network else \
        "random heterogeneous swarms (compute 4x, 10 MB/s - 1 GB/s links)"
    print(f"\n## {title}, 6 stages, 33% skip, 6 microbatches per data holder")
    print("peers seed | ours (s) | tuned full pipeline (s) | random skip (s) | ours/full | random/full | ours/LB")
    rows = []
    for n in sizes:
        for seed in seeds:
            view = random_swarm(n, seed=seed)
            if uniform_network:
                view = SwarmView(view.peers, np.full((n, n), 0.01), np.full((n, n), 1e9), view.message_overhead)
            tables = CostTables.from_view(view, default_model(6))
            rules = PathRules(6, 4)
            stage_of = place(tables, PlacementGoal(rules, 6), seed=seed, iterations=100)
            problem = problem_for(tables, stage_of, rules, 6)
            ours = plan_paths(problem, seed=seed).makespan
            full_problem = problem_for(tables, stage_of, PathRules(6, 6, max_swaps=0), 6)
            full = tune_columns(full_problem, seed=seed, iterations=300)[1]
            rnd = evaluate(problem, random_skip(problem, seed=seed), "backward_first")[1].makespan
            lb = lower_bound(problem)
            rows.append((ours / full, rnd / full))
            print(f"{n:5d} {seed:4d} | {ours:8.2f} | {full:23.2f} | {rnd:15.2f} | {ours / full:9.3f} | "
                  f"{rnd / full:11.3f} | {ours / lb:7.3f}")
    arr = np.array(rows)
    print(f"median ours/full {np.median(arr[:, 0]):.3f}, median random/full {np.median(arr[:, 1]):.3f}")


def scaling(sizes: list[tuple[int, int]]) -> None:
    print("\n## planning time and quality vs swarm size (random swarms, 33% skip, 6 microbatches/holder, one core)")
    print("peers stages | placement (s) | paths (s) | total (s) | iteration (s) | lower bound (s) | ratio")
    for n, s in sizes:
        view = random_swarm(n, seed=1)
        tables = CostTables.from_view(view, default_model(s))
        rules = PathRules.from_skip_ratio(s, 0.33)
        t0 = time.perf_counter()
        stage_of = place(tables, PlacementGoal(rules, 6), seed=1, iterations=100 if n <= 50 else 30)
        t1 = time.perf_counter()
        problem = problem_for(tables, stage_of, rules, 6)
        plan = plan_paths(problem, seed=1, iterations=400 if n <= 50 else 150)
        t2 = time.perf_counter()
        lb = lower_bound(problem)
        print(f"{n:5d} {s:6d} | {t1 - t0:13.2f} | {t2 - t1:9.2f} | {t2 - t0:9.2f} | {plan.makespan:13.2f} | "
              f"{lb:15.2f} | {plan.makespan / lb:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reference_section()
    seeds = [0, 1] if args.quick else [0, 1, 2]
    heterogeneous(seeds, [20, 30] if args.quick else [20, 30, 40])
    heterogeneous(seeds[:2], [20], uniform_network=True)
    scaling([(20, 6), (50, 6), (100, 8)] if args.quick else [(20, 6), (50, 6), (100, 8), (200, 8)])


if __name__ == "__main__":
    main()
