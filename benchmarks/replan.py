"""Re-planning time after a membership change (the churn target: <= 2 s for 50 peers).

    .venv/bin/python benchmarks/replan.py [--peers 50] [--stages 6]

Places and plans a random heterogeneous swarm once (the start of a run), then times what the scheduler does when
a peer dies or joins: survivors keep their stages, a joiner is placed incrementally, and paths are planned
again on the fixed placement (no placement search). A row re-plans after a data holder died, with the search for
a survivor to move into the shrunk group (`placement.rebalance`, on by default in a live swarm). The last row
re-plans after the relay's death again on tables that carry measured jitter (the quantiles the WAN benchmark's
peers measured), which adds the jitter-aware polish (`REPLAN_JITTER_POLISH` moves of 1 + `jitter_draws`
simulations each) that a live swarm's re-plans run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.jitter_planning import WAN_JITTER_MS  # noqa: E402
from scheduler.costs import CostTables  # noqa: E402
from scheduler.path_rules import PathRules  # noqa: E402
from scheduler.placement import PlacementGoal, place, place_joining, rebalance  # noqa: E402
from scheduler.planner import REPLAN_JITTER_POLISH, PlanOptions, default_model, plan_tables  # noqa: E402
from scheduler.profiles import random_swarm  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=50)
    parser.add_argument("--stages", type=int, default=6)
    args = parser.parse_args()
    view = random_swarm(args.peers + 1, seed=3)
    tables_all = CostTables.from_view(view, default_model(args.stages))
    rules = PathRules.from_skip_ratio(args.stages, 0.33)
    goal = PlacementGoal(rules, 6)
    ids = list(tables_all.ids)
    base_view = view.subset(ids[:-1])  # the last peer joins later
    tables = CostTables.from_view(base_view, default_model(args.stages))
    t0 = time.perf_counter()
    stage_of = place(tables, goal, seed=0, iterations=30 if args.peers > 30 else 100)
    first = plan_tables(tables, rules, PlanOptions(), stage_of=stage_of)
    t_first = time.perf_counter() - t0
    # a relay dies: survivors keep their stages
    victim = int(np.flatnonzero(stage_of == 1)[0])
    keep = [p for i, p in enumerate(tables.ids) if i != victim]
    survivors = CostTables.from_view(base_view.subset(keep), default_model(args.stages))
    t0 = time.perf_counter()
    after_death = plan_tables(survivors, rules, PlanOptions(), stage_of=np.delete(stage_of, victim), epoch=1)
    t_death = time.perf_counter() - t0
    jittery = replace(survivors, jitter=np.array(WAN_JITTER_MS) / 1e3)
    t0 = time.perf_counter()
    after_death_jitter = plan_tables(jittery, rules, replace(PlanOptions(), jitter_polish=REPLAN_JITTER_POLISH),
                                     stage_of=np.delete(stage_of, victim), epoch=1)
    t_death_jitter = time.perf_counter() - t0
    # a data holder dies: one holder carries its shard, unless a survivor moving to stage 0 pays
    victim = int(np.flatnonzero(stage_of == 0)[0])
    keep = [p for i, p in enumerate(tables.ids) if i != victim]
    survivors = CostTables.from_view(base_view.subset(keep), default_model(args.stages))
    left = np.delete(stage_of, victim)
    holders = [int(h) for h in np.flatnonzero(left == 0)]
    counts = {h: goal.microbatches_per_holder for h in holders}
    counts[holders[0]] *= 2
    t0 = time.perf_counter()
    carried = plan_tables(survivors, rules, PlanOptions(), stage_of=left, microbatch_counts=counts, epoch=1)
    t_carried = time.perf_counter() - t0
    t0 = time.perf_counter()
    moved_to, moved_counts, moves = rebalance(survivors, left, {0}, goal, counts=counts)
    t_search = time.perf_counter() - t0
    rebalanced = plan_tables(survivors, rules, PlanOptions(), stage_of=moved_to, microbatch_counts=moved_counts,
                             epoch=1)
    t_rebalanced = time.perf_counter() - t0
    # a peer joins: placed incrementally, then paths again
    t0 = time.perf_counter()
    joined = np.append(stage_of, -1)
    joined = place_joining(tables_all, joined, len(ids) - 1, goal)
    after_join = plan_tables(tables_all, rules, PlanOptions(), stage_of=joined, epoch=2)
    t_join = time.perf_counter() - t0
    print(f"{args.peers} peers, {args.stages} stages, 33% skip, 6 microbatches per data holder (one core)")
    print(f"initial placement + paths: {t_first:.2f} s (iteration {first.predicted_iteration_seconds:.2f} s)")
    print(f"re-plan after a relay died: {t_death:.2f} s (iteration {after_death.predicted_iteration_seconds:.2f} s)")
    print(f"re-plan after a peer joined (incremental placement + paths): {t_join:.2f} s (iteration "
          f"{after_join.predicted_iteration_seconds:.2f} s)")
    print(f"re-plan after a data holder died, its shard carried: {t_carried:.2f} s (iteration "
          f"{carried.predicted_iteration_seconds:.2f} s)")
    print(f"re-plan after a data holder died, with the rebalancing search ({len(moves)} move, search "
          f"{t_search:.2f} s): {t_rebalanced:.2f} s (iteration {rebalanced.predicted_iteration_seconds:.2f} s, "
          f"{rebalanced.predicted_iteration_seconds / carried.predicted_iteration_seconds:.2f}x the carried one)")
    print(f"re-plan after a relay died, on tables with measured jitter: {t_death_jitter:.2f} s (expected iteration "
          f"{after_death_jitter.predicted_iteration_seconds:.2f} s; {t_death_jitter / t_death:.2f}x the re-plan "
          "above)")


if __name__ == "__main__":
    main()
