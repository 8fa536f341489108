"""The report's plots, one PNG each: loss, tokens/s, iteration time measured vs planned, each peer's busy/idle
share, and Gantt charts of one iteration (measured from the timelines; planned, by the simulator, for comparison).

Time series mark each schedule epoch change (a re-plan) with a dashed line. Figures are drawn on
`matplotlib.figure.Figure` with the Agg canvas, never through pyplot's global state; matplotlib is imported only
when a plot is drawn. The measured Gantt keeps the planned one's conventions (`scheduler.gantt`): one colour per
microbatch, backward passes hatched, the loss step black; it adds averaging, the wait for the commit and the sends.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from swarm.peer.timeline import COMPUTE_KINDS
from swarm.report.run_dir import RunData
from swarm.report.traces import AVERAGE, COMMIT, Span, Traces

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 110
WIDE = (10, 4)
MAX_ROWS = 120
"""Peers drawn in one chart at most (the first by stage and name; the title says how many were left out)."""
MAX_GANTT_SPANS = 20_000
BUSY_COLORS = {"compute": "#2e8b57", "averaging": "#e69f00", "idle": "#d9d9d9"}


def _figure(size: tuple[float, float]) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    return fig, fig.subplots()


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def epoch_changes(run: RunData) -> list[tuple[int, int]]:
    """(iteration, epoch) of each iteration that ran under a different schedule epoch than the one before it."""
    out, previous = [], None
    for r in run.metrics:
        if r.epoch is not None and previous is not None and r.epoch != previous:
            out.append((r.iteration, r.epoch))
        previous = r.epoch if r.epoch is not None else previous
    return out


def _mark_epochs(ax: Axes, run: RunData) -> None:
    for iteration, epoch in epoch_changes(run):
        ax.axvline(iteration - 0.5, color="purple", linestyle="--", linewidth=0.9, alpha=0.7)
        ax.annotate(f"epoch {epoch}", (iteration - 0.5, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize=7, color="purple")


def plot_loss(run: RunData, path: Path) -> Path:
    fig, ax = _figure(WIDE)
    its = [r.iteration for r in run.metrics]
    ax.plot(its, [r.loss for r in run.metrics], marker="." if len(its) < 60 else None, label="training loss")
    val = [(r.iteration, r.val_loss) for r in run.metrics if r.val_loss is not None]
    if val:
        ax.plot(*zip(*val, strict=True), marker="o", linestyle="--", label="validation loss")
    _mark_epochs(ax, run)
    ax.set(xlabel="iteration", ylabel="loss", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_tokens(run: RunData, path: Path) -> Path:
    fig, ax = _figure(WIDE)
    points = [(r.iteration, r.tokens_per_s) for r in run.metrics if r.tokens_per_s is not None]
    if points:
        its, values = zip(*points, strict=True)
        ax.plot(its, values, marker="." if len(its) < 60 else None, color="tab:green", label="tokens/s")
        median = statistics.median(values)
        ax.axhline(median, color="grey", linestyle=":", label=f"median {median:,.0f}")
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "no iteration recorded its tokens/s")
    _mark_epochs(ax, run)
    ax.set(xlabel="iteration", ylabel="tokens / s", title="Throughput")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_iteration_time(run: RunData, path: Path) -> Path:
    fig, ax = _figure(WIDE)
    measured = [(r.iteration, r.seconds) for r in run.metrics if r.seconds is not None]
    planned = [(r.iteration, p) for r in run.metrics if (p := run.planned_seconds(r.epoch)) is not None]
    if measured:
        ax.plot(*zip(*measured, strict=True), marker="." if len(measured) < 60 else None, label="measured")
    if planned:
        ax.plot(*zip(*planned, strict=True), drawstyle="steps-mid", color="tab:red", linestyle="--",
                label="planned (schedule epoch's prediction)")
    if not measured and not planned:
        _no_data(ax, "no iteration times recorded")
    else:
        ax.legend(fontsize=8)
    _mark_epochs(ax, run)
    ax.set(xlabel="iteration", ylabel="seconds", title="Iteration time: measured vs planned")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def peer_label(run: RunData, traces: Traces, peer: str, stage: int | None = None) -> str:
    name = run.names.get(peer) or traces.names.get(peer) or run.name(peer)
    stage = peer_stage(run, traces, peer) if stage is None else stage
    return name if stage is None else f"{name} (stage {stage})"


def peer_stage(run: RunData, traces: Traces, peer: str) -> int | None:
    """The stage of `peer`'s last compute span, else the stage the last schedule that placed it gave it."""
    stage = traces.stages.get(peer)
    if stage is None:
        stage = next((run.schedules[e].placement[peer] for e in sorted(run.schedules, reverse=True)
                      if peer in run.schedules[e].placement), None)
    return stage


def plot_busy_idle(run: RunData, traces: Traces, path: Path) -> Path | None:
    """Each peer's share of its iterations' windows spent computing, averaging and idle (None: no timelines)."""
    times = traces.peer_times()
    times = {p: t for p, t in times.items() if t.window > 0}
    if not times:
        return None
    order = sorted(times, key=lambda p: (_or_last(peer_stage(run, traces, p)), peer_label(run, traces, p)))
    left_out = max(0, len(order) - MAX_ROWS)
    order = order[:MAX_ROWS]
    fig, ax = _figure((10, max(2.5, 0.4 * len(order) + 1.5)))
    left = [0.0] * len(order)
    for part in ("compute", "averaging", "idle"):
        values = [_share(times[p], part) for p in order]
        ax.barh(range(len(order)), values, left=left, color=BUSY_COLORS[part], label=part, edgecolor="white")
        left = [a + b for a, b in zip(left, values, strict=True)]
    for row, p in enumerate(order):
        busy = _share(times[p], "compute")
        ax.text(0.01, row, f"busy {busy:.0%}", va="center", fontsize=7, color="white" if busy > 0.1 else "black")
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"{peer_label(run, traces, p)}, {times[p].iterations} it." for p in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set(xlabel="share of the iteration's window (first compute to last averaging, all peers)",
           title="Per-peer busy / idle (measured)" + (f", {left_out} more peers not shown" if left_out else ""))
    ax.legend(fontsize=7, loc="lower right", ncol=3)
    return _save(fig, path)


def _or_last(stage: int | None) -> int:
    return 1 << 30 if stage is None else stage


def _share(t, part: str) -> float:
    value = {"compute": t.compute, "averaging": t.average, "idle": t.idle}[part]
    return value / t.window if t.window > 0 else 0.0


def plot_gantt(run: RunData, traces: Traces, iteration: int, spans: list[Span], path: Path) -> Path:
    """The measured Gantt of metrics iteration `iteration` (its `spans`: span iteration `iteration - 1`)."""
    from matplotlib.patches import Patch

    record = next((r for r in run.metrics if r.iteration == iteration), None)
    epoch = record.epoch if record is not None else None
    schedule = run.schedules.get(epoch) if epoch is not None else None
    stage_of = dict(schedule.placement) if schedule is not None else {}
    peers = sorted({s.peer for s in spans}, key=lambda p: (_or_last(stage_of.get(p, peer_stage(run, traces, p))),
                                                           peer_label(run, traces, p)))
    left_out = max(0, len(peers) - MAX_ROWS)
    peers = peers[:MAX_ROWS]
    row = {p: i for i, p in enumerate(peers)}
    spans = [s for s in spans if s.peer in row][:MAX_GANTT_SPANS]
    window = traces.window(iteration - 1)
    t0 = window[0] if window else min((s.start for s in spans), default=0.0)
    fig, ax = _figure((12, max(3, 0.45 * len(peers) + 1.8)))
    cmap = _colormap()
    for s in spans:
        left, width, y = s.start - t0, s.end - s.start, row[s.peer]
        if s.kind in COMPUTE_KINDS:
            color = "black" if s.kind == "loss" else cmap((s.microbatch or 0) % 20)
            style = {"hatch": "////", "alpha": 0.75} if s.kind == "backward" else {}
            ax.barh(y, width, left=left, height=0.7, color=color, edgecolor="black", linewidth=0.3, **style)
        elif s.kind == AVERAGE:
            ax.barh(y, width, left=left, height=0.7, color=BUSY_COLORS["averaging"], edgecolor="black", linewidth=0.3)
        elif s.kind == COMMIT:
            ax.barh(y, width, left=left, height=0.25, color="#bbbbbb")
        elif s.kind.startswith("send_"):
            ax.barh(y + 0.42, width, left=left, height=0.12, color="tab:blue")
    if record is not None and record.seconds is not None:
        ax.axvline(record.seconds, color="red", linestyle="--", linewidth=1)
    planned = run.planned_seconds(epoch)
    if planned is not None:
        ax.axvline(planned, color="tab:blue", linestyle=":", linewidth=1.2)
    ax.set_yticks(range(len(peers)))
    ax.set_yticklabels([peer_label(run, traces, p, stage_of.get(p)) for p in peers], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the iteration's first compute")
    title = f"Measured iteration {iteration}" + (f" (schedule epoch {epoch})" if epoch is not None else "")
    if record is not None and record.seconds is not None:
        title += f": {record.seconds:.2f} s measured"
        title += f", {planned:.2f} s planned" if planned is not None else ""
    ax.set_title(title + (f"; {left_out} more peers not shown" if left_out else ""))
    handles = [Patch(facecolor="grey", label="forward"), Patch(facecolor="grey", hatch="////", label="backward"),
               Patch(facecolor="black", label="loss"), Patch(facecolor=BUSY_COLORS["averaging"], label="averaging"),
               Patch(facecolor="#bbbbbb", label="wait for commit"), Patch(facecolor="tab:blue", label="send"),
               Patch(facecolor="white", edgecolor="red", linestyle="--", label="measured (metrics)"),
               Patch(facecolor="white", edgecolor="tab:blue", linestyle=":", label="planned")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=8, fontsize=7, frameon=False)
    return _save(fig, path)


def plot_planned_gantt(run: RunData, epoch: int, path: Path) -> Path | None:
    """The simulator's Gantt of schedule `epoch` on the costs it was planned with (`scheduler.gantt.render_gantt`),
    next to the measured one; None when the schedule carries no costs or does not simulate."""
    from scheduler.costs import tables_from_dict
    from scheduler.gantt import render_gantt
    from scheduler.round_trips import schedule_sim_routes
    from scheduler.simulator import simulate

    schedule = run.schedules.get(epoch)
    if schedule is None or not isinstance(schedule.meta.get("costs"), dict):
        return None
    priority = schedule.meta.get("priority", "backward_first")
    try:
        tables = tables_from_dict(schedule.meta["costs"])
        result = simulate(tables, schedule_sim_routes(schedule, tables),
                          priority=priority if priority in ("fifo", "backward_first") else "backward_first",
                          record_ops=True)
    except (ValueError, KeyError, IndexError):  # costs that do not fit the schedule: no planned chart
        return None
    if not result.ops or result.deadlocked:
        return None
    ids = [f"{run.name(p)} (stage {schedule.placement.get(p, '?')})" for p in tables.ids]
    return render_gantt(result, ids, path, title=f"Planned iteration, schedule epoch {epoch}: "
                                                 f"{result.makespan:.2f} s (simulated)")


def _colormap():
    from matplotlib import colormaps

    return colormaps["tab20"]


def _no_data(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
