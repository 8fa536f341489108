"""A run directory written by the project's own writers, without starting a swarm.

Two schedule epochs planned by the real planner (epoch 1 re-plans without peer-05, which died) and written as
`SchedulerRole` writes them (`Schedule.to_json`); metrics lines from `iteration_metrics` and the data holders' `Done`
reports; peer timelines written by `Timeline`, their spans taken from the simulator's run of each schedule; events
written by `EventLog`. Only peer-05's torn last line, as a killed process leaves it, is written by hand.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from scheduler.costs import tables_from_dict
from scheduler.planner import plan_for_profile
from scheduler.round_trips import schedule_sim_routes
from scheduler.simulator import BACKWARD, FORWARD, LOSS, simulate
from swarm.control.messages import Done
from swarm.coordinator.commit_tracker import iteration_metrics
from swarm.events import EventLog, event
from swarm.peer.timeline import Timeline

RUN_ID = "fixture-run"
ITERATIONS = 6
REPLAN_AT = 3
"""0-based: iterations 0-2 run under epoch 0, 3-5 under epoch 1."""
KIND = {FORWARD: "forward", LOSS: "loss", BACKWARD: "backward"}
T0 = 1_800_000_000.0


def _schedules():
    first = plan_for_profile(num_peers=6, num_stages=3, skip=0.33, microbatches_per_holder=2, seed=0, iterations=30)
    second = plan_for_profile(num_peers=5, num_stages=3, skip=0.33, microbatches_per_holder=2, seed=0, iterations=30)
    return (dataclasses.replace(first, run_id=RUN_ID),
            dataclasses.replace(second, epoch=1, run_id=RUN_ID, meta={**second.meta, "start_iteration": REPLAN_AT}))


def _log_events(path: Path, node: str, events: list[dict]) -> None:
    handler = EventLog(path, node)
    logger = logging.getLogger(f"tests.report.{path.stem}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        for e in events:
            name = e.pop("event")
            logger.warning("%s", name, extra=event(name, **e))
    finally:
        logger.removeHandler(handler)
        handler.close()


def build_run(run_dir: Path, *, traced: bool = True) -> Path:
    """Write the fixture run into `run_dir` (see the module docstring)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    schedules = _schedules()
    for s in schedules:
        (run_dir / f"schedule-{s.epoch}.json").write_text(s.to_json())
    peers = sorted({p for s in schedules for p in s.placement})
    timelines = {p: Timeline(run_dir / f"{p}.trace.jsonl" if traced else None, peer=p) for p in peers}
    now = T0
    with (run_dir / "metrics.jsonl").open("a") as metrics:
        for i in range(ITERATIONS):
            schedule = schedules[0] if i < REPLAN_AT else schedules[1]
            tables = tables_from_dict(schedule.meta["costs"])
            result = simulate(tables, schedule_sim_routes(schedule, tables), record_ops=True)
            for op in result.ops:
                kind = "inject" if op.kind == FORWARD and op.stage == 0 else KIND[op.kind]
                timelines[tables.ids[op.node]].record(kind, now + op.start, now + op.end, microbatch=op.microbatch,
                                                      stage=op.stage, iteration=i)
            end = now + result.makespan
            for p in schedule.placement:
                timelines[p].record("commit", end, end + 0.05, iteration=i)
                timelines[p].record("average", end + 0.05, end + 0.15, iteration=i)
                timelines[p].flush()
            reports = [Done(peer=h, iteration=i, epoch=schedule.epoch, loss_sum=2 * (8.0 - 0.3 * i), losses=2,
                            tokens=2 * 8 * 63, started=now, finished=end) for h in schedule.data_holders]
            record = iteration_metrics(i, reports, epoch=schedule.epoch, peers_online=len(schedule.placement),
                                       records={})
            metrics.write(json.dumps(record) + "\n")
            now = end + 0.5
    if traced:
        with (run_dir / "peer-05.trace.jsonl").open("a") as f:
            f.write('{"peer": "peer-05", "kind": "forw')  # killed while writing
    _log_events(run_dir / "coordinator.events.jsonl", "coordinator-id", [
        {"event": "declared_gone", "peer": "peer-05", "why": "its record expired"},
        {"event": "replanned", "epoch": 1, "start_iteration": REPLAN_AT, "gone": ["peer-05"], "leaving": [],
         "joining": []},
    ])
    for p in peers:
        _log_events(run_dir / f"{p}.events.jsonl", p, [{"event": "placed", "stage": schedules[0].placement[p],
                                                        "epoch": 0, "iteration": 0}])
    return run_dir


@pytest.fixture(scope="session")
def fixture_run(tmp_path_factory) -> Path:
    """The fixture run directory, written once per session; tests must not modify it (copy it first)."""
    return build_run(tmp_path_factory.mktemp("report") / "run")
