"""`skippipe plan` and `skippipe simulate`: plan a schedule for a swarm, and see how long its iteration takes.

With --json each prints exactly one JSON object on stdout. Bad input ends with a one-line error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

from scheduler.costs import CostTables, tables_from_dict
from scheduler.instance import InstanceError, load_instance
from scheduler.path_rules import PathRules
from scheduler.planner import PlanOptions, baseline_schedule, default_model, plan, plan_tables
from scheduler.profiles import PRESETS, ProfileError, swarm_from
from scheduler.round_trips import schedule_sim_routes
from scheduler.schedule import Schedule, ScheduleError, validate
from scheduler.simulator import simulate


def fail(message: str) -> None:
    """One line on stderr, exit status 2: what users see instead of a traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.command()
@click.option("--profile", help=f"network preset ({', '.join(PRESETS)}) or a .toml/.json profile file")
@click.option("--instance", "instance_path", type=click.Path(dir_okay=False),
              help="reference-style instance (measured link matrix in seconds)")
@click.option("--peers", type=int, help="number of peers (presets)")
@click.option("--stages", type=int, help="pipeline stages S")
@click.option("--skip", type=float, default=0.33, show_default=True, help="skip ratio k = 1 - R/S")
@click.option("--memory", type=int, default=3, show_default=True, help="activations a peer may hold (TC1)")
@click.option("--microbatches", type=int, default=6, show_default=True, help="microbatches per data holder")
@click.option("--layers", type=int, default=None, help="decoder layers of the model (default: max(24, S))")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--iterations", type=int, default=400, show_default=True, help="local-search moves")
@click.option("--no-collision-awareness", is_flag=True, help="skip the simulated-makespan refinement (TC2)")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="schedule file to write")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def plan_command(profile, instance_path, peers, stages, skip, memory, microbatches, layers, seed, iterations,
                 no_collision_awareness, output, as_json) -> None:
    """Place peers on stages and plan every microbatch's path."""
    if (profile is None) == (instance_path is None):
        fail("give exactly one of --profile or --instance")
    limits = (("--memory", memory, 1), ("--microbatches", microbatches, 1), ("--iterations", iterations, 0))
    for name, value, lo in limits:
        if value < lo:
            fail(f"{name} must be >= {lo}, got {value}")
    if not 0 <= skip < 1:
        fail(f"--skip must be in [0, 1), got {skip}")
    options = PlanOptions(microbatches_per_holder=microbatches, seed=seed, iterations=iterations,
                          collision_aware=not no_collision_awareness)
    try:
        if instance_path:
            inst = load_instance(instance_path)
            rules = PathRules(inst.num_stages, inst.stages_per_path)
            options = PlanOptions(microbatches_per_holder=inst.microbatches_per_holder, seed=seed,
                                  iterations=iterations, collision_aware=not no_collision_awareness)
            stage_of = None
            pinned = {v: 0 for v in inst.data_holders}
            if inst.partitions is not None:
                stage_of = np.full(inst.tables.num_peers, -1)
                for st, part in enumerate(inst.partitions):
                    stage_of[list(part)] = st
            schedule = plan_tables(inst.tables, rules, options, stage_of=stage_of, pinned=pinned)
        else:
            if stages is None:
                fail("--stages is required with --profile")
            if stages < 1:
                fail(f"--stages must be >= 1, got {stages}")
            view = swarm_from(profile, peers, seed=seed, memory=memory)
            if len(view) < stages:
                fail(f"{len(view)} peers cannot serve {stages} stages (need at least one peer per stage)")
            rules = PathRules.from_skip_ratio(stages, skip)
            model = default_model(stages, layers)
            schedule = plan(view, model, rules, options)
        validate(schedule)
    except (ProfileError, InstanceError, ScheduleError, ValueError, KeyError) as e:
        fail(str(e).strip("'\""))
    try:
        Path(output).write_text(schedule.to_json())
    except OSError as e:
        fail(f"cannot write {output}: {e}")
    report = {
        "schedule": str(output),
        "plan_seconds": schedule.meta.get("plan_seconds"),
        "placement_seconds": schedule.meta.get("placement_seconds"),
        "iteration_seconds": schedule.predicted_iteration_seconds,
        "peers": len(schedule.placement),
        "stages": schedule.num_stages,
        "stages_per_path": schedule.rules.stages_per_path,
        "microbatches": len(schedule.routes),
    }
    if as_json:
        click.echo(json.dumps(report))
    else:
        click.echo(f"planned {report['microbatches']} microbatches on {report['peers']} peers in "
                   f"{report['plan_seconds']:.2f} s; simulated iteration {report['iteration_seconds']:.2f} s "
                   f"-> {output}")


def load_schedule_with_costs(path: str) -> tuple[Schedule, CostTables]:
    try:
        schedule = Schedule.from_json(Path(path).read_text())
    except OSError as e:
        raise ScheduleError(f"cannot read {path}: {e}") from None
    except UnicodeDecodeError:
        raise ScheduleError(f"{path} is not a text schedule file") from None
    if "costs" not in schedule.meta:
        raise ScheduleError(f"{path} carries no swarm costs (meta.costs); plan it with `skippipe plan`")
    tables = tables_from_dict(schedule.meta["costs"])
    validate(schedule, balance_tolerance=None)
    return schedule, tables


@click.command()
@click.argument("schedule_path", type=click.Path(dir_okay=False))
@click.option("--gantt", type=click.Path(dir_okay=False), help="write a Gantt chart PNG of the iteration")
@click.option("--tune-baseline/--no-tune-baseline", default=True, show_default=True,
              help="tune the full pipeline's columns on the simulator (the fair comparison)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random-skip baseline")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def simulate_command(schedule_path, gantt, tune_baseline, seed, as_json) -> None:
    """Simulate a schedule's iteration next to the full-pipeline, random-skip and SWARM-style baselines."""
    try:
        schedule, tables = load_schedule_with_costs(schedule_path)
        priority = schedule.meta.get("priority", "backward_first")
        if priority not in ("fifo", "backward_first"):
            raise ScheduleError(f"meta.priority must be fifo or backward_first, got {priority!r}")
        result = simulate(tables, schedule_sim_routes(schedule, tables), priority=priority, record_ops=bool(gantt))
        baselines = {
            name: baseline_schedule(schedule, tables, name, seed=seed, tune=tune_baseline).predicted_iteration_seconds
            for name in ("full_pipeline", "random_skip", "swarm")
        }
    except (ScheduleError, ValueError, KeyError) as e:
        fail(str(e).strip("'\""))
    if gantt:
        from scheduler.gantt import render_gantt

        render_gantt(result, tables.ids, gantt, title=f"{schedule.planner}: {result.makespan:.2f} s")
    report = {
        "iteration_seconds": result.makespan if np.isfinite(result.makespan) else None,
        "baselines": {k: (v if v is not None and np.isfinite(v) else None) for k, v in baselines.items()},
        "collisions": result.collisions,
        "collision_delay_seconds": round(result.collision_delay, 4),
        "deadlocked": result.deadlocked,
        "planner": schedule.planner,
        "epoch": schedule.epoch,
        "peers": result.summary(tables.ids)["peers"],
    }
    if gantt:
        report["gantt"] = str(gantt)
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(f"{schedule.planner} (epoch {schedule.epoch}): {report['iteration_seconds']:.2f} s per iteration, "
               f"{result.collisions} collisions ({result.collision_delay:.2f} s waiting)")
    for name, value in report["baselines"].items():
        ratio = f" ({report['iteration_seconds'] / value:.2f}x)" if value else ""
        click.echo(f"  {name}: {value:.2f} s{ratio}" if value else f"  {name}: deadlocked")
    if gantt:
        click.echo(f"  gantt chart: {gantt}")
