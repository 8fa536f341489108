"""`plan()`: the one call that turns a swarm view into a signed-ready `Schedule` (placement + paths).

Also the baselines' schedules for the same swarm and a convenience for planning on a preset network.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from scheduler.baselines import full_pipeline, random_skip, tune_columns
from scheduler.constants import DEFAULT_MEMORY_SLOTS
from scheduler.costs import CostTables, tables_from_dict, tables_to_dict
from scheduler.expected_makespan import expected_makespan
from scheduler.path_rules import PathRules, rules_around
from scheduler.paths import PathProblem, PlannedRoute, evaluate, plan_paths, to_sim_routes
from scheduler.placement import PlacementGoal, place, stage_sizes
from scheduler.profiles import swarm_from
from scheduler.schedule import Route, Schedule
from scheduler.simulator import Priority
from scheduler.swarm_balance import swarm_placement
from scheduler.swarm_tuning import tune_swarm_placement
from scheduler.swarm_view import ModelCost, SwarmView
from scheduler.swarm_wiring import expected_makespan_over_draws, redraw

REPLAN_JITTER_POLISH = 20
"""Jitter-aware local-search moves of a re-plan (a first plan makes `PlanOptions.jitter_polish`): a membership
change holds the swarm until the new epoch is out, and each such move costs 1 + jitter_draws simulations."""

SWARM_SCORE_DRAWS = 16
"""Independent wirings a SWARM-style schedule is also scored on (`meta["over_draws_seconds"]`): the iterations a
per-iteration redraw would run, next to the one draw the schedule carries."""

DEFAULT_MODEL = ModelCost.balanced(num_layers=24, num_stages=6, activation_bytes=8 * 1024 * 1024 * 4)
"""The paper's 500M-class model: 24 layers, an 8-sample x 1024-token x 1024-dim fp32 activation (32 MiB)."""


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of one planning call."""

    microbatches_per_holder: int = 6
    seed: int = 0
    iterations: int = 400
    """Local-search moves on the simulated makespan (a fixed budget keeps plans deterministic)."""
    placement_iterations: int = 100
    collision_aware: bool = True
    priority: Priority = "backward_first"
    jitter_draws: int = 8
    """Jittered simulations per score in the polish below (only where the tables carry measured jitter)."""
    jitter_polish: int = 100
    """Local-search moves after the on-time ones, scored on the expected makespan under the measured jitter
    (costs 1 + jitter_draws simulations each; 0 = off)."""


def default_model(num_stages: int, num_layers: int | None = None) -> ModelCost:
    layers = num_layers or max(24, num_stages)
    return ModelCost.balanced(num_layers=layers, num_stages=num_stages, activation_bytes=8 * 1024 * 1024 * 4)


def make_schedule(tables: CostTables, stage_of: np.ndarray, routes: list[PlannedRoute], rules: PathRules, *,
                  epoch: int, planner: str, predicted: float | None, run_id: str = "", meta: dict | None = None,
                  priority: Priority = "backward_first") -> Schedule:
    """Package planner output (peer indices) as a `Schedule` (peer ids), with the costs it was planned on.

    Where the tables carry measured jitter, the predicted iteration is the expected makespan under it (the
    on-time makespan `predicted` goes to `meta["on_time_seconds"]`): deadlines and the runtime's comparisons
    then start from what the network can deliver.
    """
    ids = tables.ids
    placement = {ids[v]: int(st) for v, st in enumerate(stage_of) if st >= 0}
    memory = {ids[v]: int(tables.memory[v]) for v, st in enumerate(stage_of) if st >= 0}
    sched_routes = tuple(
        Route(microbatch=i, origin=ids[r.origin], stages=r.stages, peers=tuple(ids[v] for v in r.nodes),
              inject_after=float(r.inject_at))
        for i, r in enumerate(routes)
    )
    full_meta = {"costs": tables_to_dict(tables)}
    full_meta.update(meta or {})
    if tables.jitter is not None and predicted is not None:
        expected = expected_makespan(tables, to_sim_routes(routes), priority=priority)
        if expected.draws:
            full_meta.update(on_time_seconds=predicted, jitter_p90_seconds=round(expected.p90, 4))
            predicted = expected.mean
    return Schedule(epoch=epoch, rules=rules, placement=placement, memory=memory, routes=sched_routes,
                    run_id=run_id, predicted_iteration_seconds=predicted, planner=planner, meta=full_meta)


def problem_for(tables: CostTables, stage_of: np.ndarray, rules: PathRules, microbatches_per_holder: int,
                counts: dict[int, int] | None = None) -> PathProblem:
    """The path problem for a placement; `counts` (peer index -> microbatches) overrides the per-holder number."""
    holders = tuple(int(v) for v in np.flatnonzero(stage_of == 0))
    per_holder = tuple((counts or {}).get(h, microbatches_per_holder) for h in holders)
    return PathProblem(tables, stage_of, holders, per_holder, rules)


def plan_tables(tables: CostTables, rules: PathRules, options: PlanOptions = PlanOptions(), *,
                stage_of: np.ndarray | None = None, pinned: dict[int, int] | None = None,
                goal: PlacementGoal | None = None, epoch: int = 0, run_id: str = "",
                microbatch_counts: dict[int, int] | None = None) -> Schedule:
    """Place (unless `stage_of` is given) and plan paths on cost tables.

    :param microbatch_counts: peer index -> microbatches it injects, for holders that carry more (or fewer)
        than `options.microbatches_per_holder` (e.g. a holder that took over a departed holder's shard)
    """
    t0 = time.perf_counter()
    if stage_of is None:
        goal = goal or PlacementGoal(rules=rules, microbatches_per_holder=options.microbatches_per_holder)
        stage_of = place(tables, goal, pinned=pinned, seed=options.seed, iterations=options.placement_iterations)
    t_place = time.perf_counter() - t0
    problem = problem_for(tables, stage_of, rules, options.microbatches_per_holder, microbatch_counts)
    plan = plan_paths(problem, seed=options.seed, iterations=options.iterations,
                      collision_aware=options.collision_aware, priority=options.priority,
                      jitter_draws=options.jitter_draws, jitter_polish=options.jitter_polish)
    elapsed = time.perf_counter() - t0
    name = "skippipe" if options.collision_aware else "skippipe_without_collision_awareness"
    return make_schedule(tables, stage_of, plan.routes, rules, epoch=epoch, planner=name,
                         predicted=plan.makespan, run_id=run_id, priority=options.priority,
                         meta={"seed": options.seed, "plan_seconds": round(elapsed, 4),
                               "placement_seconds": round(t_place, 4), "priority": options.priority,
                               "microbatches_per_holder": options.microbatches_per_holder})


def plan(view: SwarmView, model: ModelCost, rules: PathRules, options: PlanOptions = PlanOptions(), *,
         epoch: int = 0, run_id: str = "", placement: dict[str, int] | None = None) -> Schedule:
    """A schedule for `view`: data holders pinned to stage 0, `placement` (peer id -> stage) kept where given."""
    if model.num_stages != rules.num_stages:
        raise ValueError(f"model has {model.num_stages} stages, rules {rules.num_stages}")
    tables = CostTables.from_view(view, model)
    pinned = {i: 0 for i, p in enumerate(view.peers) if p.data_holder}
    for pid, st in (placement or {}).items():
        pinned[view.index(pid)] = st
    goal = PlacementGoal(rules=rules, microbatches_per_holder=options.microbatches_per_holder,
                         stage_param_bytes=model.stage_param_bytes, latency=view.latency, bandwidth=view.bandwidth)
    stage_of = None
    if placement is not None and len(pinned) == len(view.peers):
        stage_of = np.array([pinned[i] for i in range(len(view.peers))])
    return plan_tables(tables, rules, options, stage_of=stage_of, pinned=pinned, goal=goal, epoch=epoch,
                       run_id=run_id)


def baseline_schedule(schedule: Schedule, tables: CostTables, method: str, *, seed: int = 0,
                      tune: bool = False, priority: Priority = "backward_first",
                      microbatch_counts: dict[int, int] | None = None) -> Schedule:
    """`full_pipeline` (DT-FM; `tune` = columns tuned on the simulator), `random_skip` or `swarm` (SWARM-style
    stochastic wiring on its own throughput-balanced placement of the peers off stage 0), for the same swarm, data
    holders and work (every data holder's microbatches) as `schedule`.

    :param microbatch_counts: peer index -> microbatches it injects, as in `plan_tables`
    """
    stage_of = np.array([schedule.placement.get(i, -1) for i in tables.ids])
    per_holder = len(schedule.routes) // max(1, len(schedule.data_holders))
    mb = int(schedule.meta.get("microbatches_per_holder") or max(1, per_holder))
    if method == "full_pipeline":
        rules = PathRules(schedule.num_stages, schedule.num_stages, max_swaps=0)
        if schedule.rules.unserved:  # a stage without peers: the pipeline runs without it
            rules = rules_around(rules, schedule.rules.unserved)[0]
        problem = problem_for(tables, stage_of, rules, mb, microbatch_counts)
        columns = tune_columns(problem, seed=seed, priority=priority)[0] if tune else None
        routes = full_pipeline(problem, columns)
    elif method == "swarm":
        own = swarm_own_placement(tables, stage_of, schedule.num_stages, mb, microbatch_counts, seed=seed) \
            if np.all(stage_of >= 0) else stage_of
        return swarm_schedule(tables, own, schedule.num_stages, microbatches_per_holder=mb,
                              microbatch_counts=microbatch_counts, seed=seed, epoch=schedule.epoch,
                              run_id=schedule.run_id, priority=priority)
    elif method == "random_skip":
        rules = schedule.rules
        problem = problem_for(tables, stage_of, rules, mb, microbatch_counts)
        routes = random_skip(problem, seed=seed)
    else:
        raise ValueError(f"unknown baseline {method!r}")
    score, res = evaluate(problem, routes, priority)
    return make_schedule(tables, stage_of, routes, rules, epoch=schedule.epoch, planner=method,
                         predicted=res.makespan, run_id=schedule.run_id, priority=priority,
                         meta={"microbatches_per_holder": mb, "seed": seed})


def swarm_own_placement(tables: CostTables, stage_of: np.ndarray, num_stages: int, microbatches_per_holder: int,
                        microbatch_counts: dict[int, int] | None = None, *, seed: int = 0,
                        iterations: int = 100) -> np.ndarray:
    """The SWARM baseline's own placement of the peers off stage 0 of `stage_of` (its data holders stay): balanced by
    throughput (`swarm_balance`), then tuned on the simulated iteration of its wiring (`swarm_tuning`)."""
    pinned = {int(v): 0 for v in np.flatnonzero(stage_of == 0)}
    balanced = swarm_placement(tables, num_stages, len(pinned), pinned=pinned)
    if iterations <= 0 or num_stages < 3:
        return balanced
    problem = problem_for(tables, balanced, PathRules(num_stages, num_stages, max_swaps=0), microbatches_per_holder,
                          microbatch_counts)
    return tune_swarm_placement(problem, seed=seed, iterations=iterations)[0]


def swarm_schedule(tables: CostTables, stage_of: np.ndarray, num_stages: int, *, microbatches_per_holder: int,
                   microbatch_counts: dict[int, int] | None = None, seed: int = 0, epoch: int = 0, run_id: str = "",
                   priority: Priority = "backward_first", draws: int = SWARM_SCORE_DRAWS) -> Schedule:
    """The SWARM-style schedule on placement `stage_of`: every microbatch visits every stage that has peers, in
    order, each hop to a peer drawn in proportion to its throughput (`scheduler.swarm_wiring`), from the seed and
    epoch (a re-plan redraws the wiring). The runtime keeps one draw for the whole epoch.

    `predicted_iteration_seconds` is this draw's simulated iteration; `meta["over_draws_seconds"]` gives the mean,
    min and max over `draws` other draws (what a fresh draw per iteration, as in SWARM, would run).
    """
    unserved = {s for s in range(1, num_stages) if not np.any(stage_of == s)}
    rules = PathRules(num_stages, num_stages, max_swaps=0)
    if unserved:  # a stage without peers: the pipeline runs without it until a peer takes it over
        rules = rules_around(rules, unserved)[0]
    t0 = time.perf_counter()
    problem = problem_for(tables, stage_of, rules, microbatches_per_holder, microbatch_counts)
    routes = redraw(problem, seed, epoch, 0)
    _, res = evaluate(problem, routes, priority)
    over = expected_makespan_over_draws(problem, seed=seed + 1, draws=draws, priority=priority) if draws else None
    meta = {"microbatches_per_holder": microbatches_per_holder, "seed": seed, "priority": priority,
            "wiring": {"seed": seed, "epoch": epoch, "redrawn": "per epoch"},
            "plan_seconds": round(time.perf_counter() - t0, 4)}
    if over is not None:
        meta["over_draws_seconds"] = {"mean": round(float(over.mean()), 4), "min": round(float(over.min()), 4),
                                      "max": round(float(over.max()), 4), "draws": int(len(over))}
    return make_schedule(tables, stage_of, routes, rules, epoch=epoch, planner="swarm", predicted=res.makespan,
                         run_id=run_id, priority=priority, meta=meta)


def swarm_wiring_for_iteration(schedule: Schedule, iteration: int) -> Schedule:
    """The SWARM-style `schedule` with the wiring of `iteration` of its epoch: the same placement, microbatch ids,
    origins and stages, each hop's peer drawn afresh from the schedule's own costs and wiring seed. Pure and
    deterministic, so every peer derives the same wiring; iteration 0 is the schedule's own.

    The runtime does not call it yet (peers follow one wiring per epoch): redrawing per iteration, as SWARM does,
    needs each peer to run each iteration under this schedule instead of the epoch's.

    :raises ValueError: not a SWARM-style schedule, or one without its costs and wiring seed
    """
    if schedule.planner != "swarm" or "wiring" not in schedule.meta or "costs" not in schedule.meta:
        raise ValueError("only a SWARM-style schedule with its costs and wiring seed can be rewired")
    tables = tables_from_dict(schedule.meta["costs"])
    stage_of = np.array([schedule.placement.get(i, -1) for i in tables.ids])
    wiring = schedule.meta["wiring"]
    seed, epoch = wiring.get("seed"), wiring.get("epoch")
    try:
        holders = tuple(tables.index(h) for h in dict.fromkeys(r.origin for r in schedule.routes))
    except KeyError as e:
        raise ValueError(f"a route's origin is not in the schedule's costs: {e}") from None
    counts = tuple(sum(1 for r in schedule.routes if r.origin == tables.ids[h]) for h in holders)
    problem = PathProblem(tables, stage_of, holders, counts, schedule.rules)
    drawn = redraw(problem, seed, epoch, iteration)
    if [tables.ids[r.origin] for r in drawn] != [r.origin for r in schedule.routes]:
        raise ValueError("the schedule's routes are not in the order its wiring draws them")
    routes = tuple(replace(old, peers=tuple(tables.ids[v] for v in new.nodes))
                   for old, new in zip(schedule.routes, drawn))
    return replace(schedule, routes=routes)


def plan_swarm(view: SwarmView, model: ModelCost, rules: PathRules, options: PlanOptions = PlanOptions(), *,
               epoch: int = 0, run_id: str = "", placement: dict[str, int] | None = None) -> Schedule:
    """A SWARM-style schedule for `view` on SWARM's own placement: data holders and `placement` (peer id -> stage)
    kept, as many data holders as the sizing rule gives for paths through every stage (the holders pinned, if more;
    about one peer in S: stage 0 balanced with the others, as for the full pipeline's own placement), the other
    peers balanced over the stages by throughput (`swarm_balance.swarm_placement`), then, unless some are pinned off
    stage 0, tuned on the simulated iteration of the wiring for `options.placement_iterations` steps
    (`swarm_tuning`). Of `rules` only the number of stages counts: the paths visit every stage."""
    if model.num_stages != rules.num_stages:
        raise ValueError(f"model has {model.num_stages} stages, rules {rules.num_stages}")
    tables = CostTables.from_view(view, model)
    pinned = {i: 0 for i, p in enumerate(view.peers) if p.data_holder}
    for pid, st in (placement or {}).items():
        pinned[view.index(pid)] = st
    if len(pinned) == len(view.peers):
        stage_of = np.array([pinned[i] for i in range(len(view.peers))])
    else:
        have = sum(1 for st in pinned.values() if st == 0)
        full = PathRules(rules.num_stages, rules.num_stages, max_swaps=0)  # sized for paths through every stage
        holders = max(have, stage_sizes(len(view.peers), full, have or None)[0])
        stage_of = swarm_placement(tables, rules.num_stages, holders, pinned=pinned)
        if not any(st > 0 for st in pinned.values()) and rules.num_stages >= 3:  # nothing pinned off stage 0: tune
            problem = problem_for(tables, stage_of, PathRules(rules.num_stages, rules.num_stages, max_swaps=0),
                                  options.microbatches_per_holder)
            stage_of = tune_swarm_placement(problem, seed=options.seed, iterations=options.placement_iterations)[0]
    return swarm_schedule(tables, stage_of, rules.num_stages, microbatches_per_holder=options.microbatches_per_holder,
                          seed=options.seed, epoch=epoch, run_id=run_id, priority=options.priority)


def plan_for_profile(profile: str = "single-cluster", *, num_peers: int, num_stages: int, skip: float,
                     microbatches_per_holder: int = 4, memory: int = DEFAULT_MEMORY_SLOTS, seed: int = 0,
                     num_layers: int | None = None, iterations: int = 400) -> Schedule:
    """Place and plan on a preset network (or a profile file): the in-process swarm and demos use this."""
    view = swarm_from(profile, num_peers, seed=seed, memory=memory)
    rules = PathRules.from_skip_ratio(num_stages, skip)
    options = PlanOptions(microbatches_per_holder=microbatches_per_holder, seed=seed, iterations=iterations)
    return plan(view, default_model(num_stages, num_layers), rules, options)
