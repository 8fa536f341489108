"""`read_run`: what a run directory holds, read and checked: metrics, schedules, events, names of the processes.

A run directory is what `skippipe swarm local --run-dir` or `skippipe coordinator start --run-dir` writes:
`metrics.jsonl` (one line per committed iteration), `schedule-N.json` (one file per schedule epoch),
`NAME.events.jsonl` (each process's typed events) and, for peers started with `--trace`, `NAME.trace.jsonl` (their
timelines, read by `swarm.report.traces`). Only `metrics.jsonl` is required; everything else adds to the report
when it is there. Every file is hostile input: a malformed line or file is skipped and counted in `RunData.warnings`,
never raised; only a directory that is not a run raises `NotARunError`, naming what is missing.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.schedule import Schedule
from swarm.events import EVENTS
from swarm.report.json_lines import LineCounter, read_json_lines, regular_file

METRICS_FILE = "metrics.jsonl"
MAX_METRICS_BYTES = 1 << 30
MAX_SCHEDULE_BYTES = 64 << 20
MAX_SMALL_FILE_BYTES = 1 << 20
"""run.toml, coordinator.json: a few hundred bytes each."""
MAX_FILES = 4096
"""Schedules or event files read at most (the newest schedules are kept)."""
_SCHEDULE_NAME = re.compile(r"schedule-(\d{1,12})\.json")
_MAX_INT = 1 << 62


class NotARunError(ValueError):
    """The directory is not a run directory; the message names what is missing."""


@dataclass(frozen=True)
class IterationRecord:
    """One line of metrics.jsonl: a committed iteration (1-based), as the scheduler (or `swarm inprocess`) wrote it."""

    iteration: int
    loss: float
    tokens_per_s: float | None = None
    seconds: float | None = None
    """The iteration's span, from the first data holder's start to the last one's finish."""
    epoch: int | None = None
    peers_online: int | None = None
    time: float | None = None
    val_loss: float | None = None


@dataclass
class RunData:
    """Everything read from a run directory (see the module docstring)."""

    path: Path
    metrics: list[IterationRecord]
    """Sorted by iteration, one per iteration."""
    schedules: dict[int, Schedule] = field(default_factory=dict)
    """Epoch -> its schedule."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """Known events (swarm.events.EVENTS) with a time and a node, oldest first."""
    names: dict[str, str] = field(default_factory=dict)
    """Peer id -> the name of the process that wrote its events (e.g. "peer-03", "coordinator")."""
    run_id: str | None = None
    model: str | None = None
    warnings: list[str] = field(default_factory=list)

    def planned_seconds(self, epoch: int | None) -> float | None:
        """The planner's predicted iteration time of `epoch` (None if unknown)."""
        schedule = self.schedules.get(epoch) if epoch is not None else None
        return schedule.predicted_iteration_seconds if schedule is not None else None

    def name(self, peer: str) -> str:
        """A short readable name for `peer`: its process name if known, else the start of its id."""
        return self.names.get(peer) or (peer[:10] + "…" if len(peer) > 11 else peer)


def read_run(path: str | Path) -> RunData:
    """Read and check the run directory at `path`.

    :raises NotARunError: `path` is not a directory, or holds no metrics.jsonl with at least one valid iteration
    """
    root = Path(path)
    if not root.exists():
        raise NotARunError(f"{root}: no such directory")
    if not root.is_dir():
        raise NotARunError(f"{root} is a file, not a run directory")
    metrics_file = root / METRICS_FILE
    if not regular_file(metrics_file):
        raise NotARunError(f"{root} is not a run directory: it has no {METRICS_FILE} (a run directory is what "
                           f"`skippipe swarm local --run-dir` or `skippipe coordinator start --run-dir` writes)")
    warnings: list[str] = []
    metrics = _read_metrics(metrics_file, warnings)
    run = RunData(path=root, metrics=metrics, warnings=warnings)
    run.schedules = _read_schedules(root, warnings)
    run.events, run.names = _read_events(root, warnings)
    run.run_id = _run_id(root, run.schedules)
    run.model = _model(root, warnings)
    return run


# ---- metrics ----------------------------------------------------------------------------------------
def committed_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metrics records in the order written, less those a later record supersedes: a scheduler killed right after
    it wrote down a commit may never have announced it, and its successor then runs that iteration again under a
    newer epoch; the successor's record of an iteration replaces every earlier record of it and of those after it.
    A record of an older epoch than one written before it is a stale scheduler's, not a successor's (a coordinator
    frozen as it committed, which wrote its commit down once thawed, after its successor had gone on): dropped."""
    out: list[dict[str, Any]] = []
    newest = 0
    for r in records:
        epoch = r.get("epoch", 0)
        if not isinstance(epoch, int) or epoch < newest:
            continue
        newest = epoch
        while out and out[-1].get("iteration", 0) >= r.get("iteration", 0):
            out.pop()
        out.append(r)
    return out


def _read_metrics(path: Path, warnings: list[str]) -> list[IterationRecord]:
    counter = LineCounter(path)
    valid: list[dict[str, Any]] = []
    try:
        if path.stat().st_size > MAX_METRICS_BYTES:
            raise NotARunError(f"{path} is larger than {MAX_METRICS_BYTES >> 20} MiB: not a metrics file of this "
                               f"project")
        for raw in read_json_lines(path, counter):
            if iteration_record(raw) is None:
                counter.skipped += 1
            else:
                valid.append(raw)
    except OSError as e:
        raise NotARunError(f"cannot read {path}: {e}") from None
    if not valid:
        raise NotARunError(f"{path} holds no valid iteration record ({counter.lines} lines, "
                           f"{counter.skipped} malformed)")
    if (w := counter.warning("malformed")) is not None:
        warnings.append(w)
    kept = committed_records(valid)
    if len(kept) < len(valid):
        warnings.append(f"{path.name}: {len(valid) - len(kept)} records superseded by a later record of the same "
                        f"iteration (a successor scheduler's rerun; the later kept) or of an epoch older than one "
                        f"before them (a stale scheduler's; dropped)")
    return [r for r in map(iteration_record, kept) if r is not None]


def iteration_record(d: dict[str, Any]) -> IterationRecord | None:
    """The record of a metrics line, or None if a field is missing or of the wrong type or range."""
    try:
        return IterationRecord(
            iteration=_int(d.get("iteration")),
            loss=_float(d.get("loss")),
            tokens_per_s=_optional(_float, d.get("tokens_per_s")),
            seconds=_optional(_float, d.get("iteration_seconds", d.get("seconds"))),
            epoch=_optional(_int, d.get("epoch")),
            peers_online=_optional(_int, d.get("peers_online")),
            time=_optional(_float, d.get("time")),
            val_loss=_optional(_float, d.get("val_loss")),
        )
    except ValueError:
        return None


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_INT:
        raise ValueError("not an integer in range")
    return v


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or abs(v) > 1e18:
        raise ValueError("not a finite number")
    return float(v)


def _optional(parse, v: Any):
    return None if v is None else parse(v)


# ---- schedules --------------------------------------------------------------------------------------
def _read_schedules(root: Path, warnings: list[str]) -> dict[int, Schedule]:
    files = []
    try:
        for p in root.iterdir():
            m = _SCHEDULE_NAME.fullmatch(p.name)
            if m and regular_file(p):
                files.append((int(m.group(1)), p))
    except OSError as e:
        warnings.append(f"cannot list {root}: {e.strerror or e}; no schedules read")
    files.sort()
    if len(files) > MAX_FILES:
        warnings.append(f"{len(files)} schedule files: only the newest {MAX_FILES} read")
        files = files[-MAX_FILES:]
    schedules: dict[int, Schedule] = {}
    for number, p in files:
        try:
            if p.stat().st_size > MAX_SCHEDULE_BYTES:
                raise ValueError(f"larger than {MAX_SCHEDULE_BYTES >> 20} MiB")
            schedule = Schedule.from_json(p.read_bytes().decode())
        except (OSError, ValueError, RecursionError) as e:  # ScheduleError and bad UTF-8 are ValueErrors
            warnings.append(f"{p.name}: skipped, not a readable schedule ({_short(e)})")
            continue
        if schedule.epoch != number or schedule.epoch in schedules:
            warnings.append(f"{p.name}: skipped, it holds epoch {schedule.epoch}")
            continue
        schedules[schedule.epoch] = schedule
    return schedules


def _short(e: BaseException, limit: int = 160) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "…"


# ---- events -----------------------------------------------------------------------------------------
def _read_events(root: Path, warnings: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    files = sorted(p for p in root.glob("*.events.jsonl") if regular_file(p))[:MAX_FILES]
    events, names = [], {}
    for p in files:
        counter = LineCounter(p)
        name = p.name[: -len(".events.jsonl")]
        nodes = set()
        try:
            for e in read_json_lines(p, counter):
                if not (e.get("event") in EVENTS and isinstance(e.get("node"), str) and _is_time(e.get("time"))):
                    counter.skipped += 1
                    continue
                nodes.add(e["node"])
                events.append(e)
        except OSError as err:
            warnings.append(f"{p.name}: skipped, cannot read it ({err.strerror})")
            continue
        if (w := counter.warning("malformed or unknown events")) is not None:
            warnings.append(w)
        if len(nodes) == 1:  # a process's events all carry its peer id: that names the peer
            names.setdefault(nodes.pop(), name)
    events.sort(key=lambda e: e["time"])
    return events, names


def _is_time(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


# ---- run id and model -------------------------------------------------------------------------------
def _run_id(root: Path, schedules: dict[int, Schedule]) -> str | None:
    for epoch in sorted(schedules, reverse=True):
        if schedules[epoch].run_id:
            return schedules[epoch].run_id
    address = root / "coordinator.json"  # holds the join token too: only run_id is read from it
    data = _small_json(address)
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) and 0 < len(run_id) <= 128 else None


def _small_json(path: Path) -> Any:
    if not regular_file(path):
        return None
    try:
        if path.stat().st_size > MAX_SMALL_FILE_BYTES:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _model(root: Path, warnings: list[str]) -> str | None:
    """The model flavor from the run's run.toml, if one was copied into the run directory."""
    path = root / "run.toml"
    if not regular_file(path):
        return None
    try:
        if path.stat().st_size > MAX_SMALL_FILE_BYTES:
            raise ValueError("too large")
        config = tomllib.loads(path.read_bytes().decode())
    except (OSError, ValueError, RecursionError) as e:  # TOMLDecodeError and bad UTF-8 are ValueErrors
        warnings.append(f"run.toml: skipped, not readable ({_short(e)})")
        return None
    if isinstance(config.get("model"), dict):  # an explicit [model] table (an imported checkpoint, say)
        return "custom"
    table = config.get("run", {})
    model = table.get("model", "tiny") if isinstance(table, dict) else None  # "tiny" is RunConfig's default
    return model if isinstance(model, str) and 0 < len(model) <= 64 else None
